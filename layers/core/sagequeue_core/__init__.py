"""sagequeue's server side: the code the Lambda functions run, deployed as the `core` layer.

The SDK's embedded stack (`sagequeue.local`) imports these same modules, so the handlers that run in
Lambda and the ones that run on a laptop are one implementation.
"""

__version__ = "0.1.0"
