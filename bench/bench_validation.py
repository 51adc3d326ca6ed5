"""What checking a submission against SageMaker's service model costs the API.

    python bench/bench_validation.py [--repeat N]

Prints, for a typical CreateTrainingJob request (about 0.9 KB of JSON) and a large one (100
hyperparameters, 40 tags, 4 input channels): the median time of `validate_create_training_job`, next to
`json.loads` of the same body as the baseline in the same run, and the one-off cost of loading the model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "layers" / "core"))

from sagequeue_core import validation


def typical() -> dict[str, Any]:
    return {
        "TrainingJobName": "llama-ft-0412",
        "RoleArn": "arn:aws:iam::123456789012:role/SageMakerTraining",
        "AlgorithmSpecification": {
            "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/neuron:2.21",
            "TrainingInputMode": "File",
        },
        "HyperParameters": {"epochs": "3", "lr": "0.0001", "model_id": "meta-llama/Llama-3.1-8B"},
        "InputDataConfig": [
            {
                "ChannelName": "train",
                "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://my-bucket/train"}},
            }
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://my-bucket/output"},
        "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 2, "VolumeSizeInGB": 200},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "CheckpointConfig": {"S3Uri": "s3://my-bucket/checkpoints/llama-ft-0412"},
        "Environment": {"NEURON_CC_FLAGS": "--model-type=transformer"},
        "Tags": [{"Key": "team", "Value": "research"}],
    }


def large() -> dict[str, Any]:
    request = typical()
    request["HyperParameters"] = {f"param_{i}": str(i) for i in range(100)}
    request["Tags"] = [{"Key": f"tag-{i}", "Value": f"value {i}"} for i in range(40)]
    request["InputDataConfig"] = [
        {
            "ChannelName": f"channel{i}",
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": f"s3://my-bucket/c{i}"}},
        }
        for i in range(4)
    ]
    return request


def median_us(work: Any, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    start = time.perf_counter()
    validation.validate_create_training_job(typical())
    print(f"first call (loads the SageMaker model): {(time.perf_counter() - start) * 1e3:.0f} ms")
    for label, request in (("typical", typical()), ("large", large())):
        body = json.dumps(request)
        parse = median_us(lambda body=body: json.loads(body), args.repeat)
        check = median_us(
            lambda request=request: validation.validate_create_training_job(request), args.repeat
        )
        print(
            f"{label} ({len(body)} bytes): validate {check:.0f} us, json.loads {parse:.0f} us, "
            f"ratio {check / parse:.1f}x"
        )


if __name__ == "__main__":
    main()
