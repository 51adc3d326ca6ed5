"""What runs inside the training image: the NEFF cache, the NeuronCore utilization publisher, the runner.

Nothing here imports the server side beyond `sagequeue_core.defaults` and `sagequeue_core.retry` (the
one retry policy; both standard library only), so the image carries only boto3,
huggingface_hub and click.
"""
