"""What runs inside the training image: the NEFF cache, the NeuronCore utilization publisher, checkpoint
reports, the runner.

Nothing here imports the server side beyond `sagequeue_core.defaults`, `sagequeue_core.retry` (the
one retry policy) and `sagequeue_core.checkpoint_marker` (the marker the scheduler reads), all standard
library only, so the image carries only boto3, huggingface_hub and click.
"""
