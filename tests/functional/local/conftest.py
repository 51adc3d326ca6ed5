"""A small SAM template of the test's own, its recorder function, and a moto server in an account of its own.

The template exercises what the local stack reads from template.yaml (short tags, conditions, Globals,
GSIs, every kind of event source) without depending on the server code.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from sagequeue.local.stack import _start_moto

RECORDER = """
import json
import threading

EVENTS = []
ACTIVE = 0
MAX_ACTIVE = 0
FAILURES_LEFT = 0
STARTED = threading.Event()
RELEASE = threading.Event()
_lock = threading.Lock()


def handler(event, context):
    global ACTIVE, MAX_ACTIVE, FAILURES_LEFT
    with _lock:
        ACTIVE += 1
        MAX_ACTIVE = max(MAX_ACTIVE, ACTIVE)
    try:
        if isinstance(event, dict) and event.get("hold"):
            STARTED.set()
            RELEASE.wait(5)
        with _lock:
            if FAILURES_LEFT > 0:
                FAILURES_LEFT -= 1
                raise RuntimeError("the recorder was told to fail")
        EVENTS.append(event)
        if isinstance(event, dict) and "malformed" in str(event.get("body") or ""):
            return "not a proxy response"
        return {
            "statusCode": 200,
            "headers": {"Content-Type": "application/json"},
            "body": json.dumps({"function": context.function_name, "event": event}),
        }
    finally:
        with _lock:
            ACTIVE -= 1
"""

TEMPLATE = """
AWSTemplateFormatVersion: "2010-09-09"
Transform: AWS::Serverless-2016-10-31
Parameters:
  Env:
    Type: String
    Default: dev
    AllowedValues: [dev, prod]
  Roles:
    Type: CommaDelimitedList
    Default: "a,b"
  Required:
    Type: String
Conditions:
  IsProd: !Equals [!Ref Env, prod]
  NotProd: !Not [!Condition IsProd]
Mappings:
  Sizes:
    dev: {Memory: 256}
    prod: {Memory: 1024}
Globals:
  Function:
    Runtime: python3.12
    MemorySize: !FindInMap [Sizes, !Ref Env, Memory]
    Environment:
      Variables:
        TABLE: !Ref Table
        STAGE: !Ref Env
Resources:
  Table:
    Type: AWS::DynamoDB::Table
    Properties:
      TableName: !Sub "${AWS::StackName}-items"
      BillingMode: PAY_PER_REQUEST
      AttributeDefinitions:
        - {AttributeName: pk, AttributeType: S}
        - {AttributeName: team, AttributeType: S}
        - {AttributeName: rank, AttributeType: N}
      KeySchema:
        - {AttributeName: pk, KeyType: HASH}
      GlobalSecondaryIndexes:
        - IndexName: by_team
          KeySchema:
            - {AttributeName: team, KeyType: HASH}
            - {AttributeName: rank, KeyType: RANGE}
          Projection: {ProjectionType: ALL}
  ProdOnlyTable:
    Type: AWS::DynamoDB::Table
    Condition: IsProd
    Properties:
      BillingMode: PAY_PER_REQUEST
      AttributeDefinitions: [{AttributeName: pk, AttributeType: S}]
      KeySchema: [{AttributeName: pk, KeyType: HASH}]
  Bus:
    Type: AWS::Events::EventBus
    Properties:
      Name: !Sub "${AWS::StackName}-bus"
  Topic:
    Type: AWS::SNS::Topic
  DeadLetters:
    Type: AWS::SQS::Queue
  Work:
    Type: AWS::SQS::Queue
  Recorder:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: functions/recorder/
      Handler: app.handler
      EventInvokeConfig:
        MaximumRetryAttempts: 1
        DestinationConfig:
          OnFailure: {Type: SQS, Destination: !GetAtt DeadLetters.Arn}
      Environment:
        Variables:
          EXTRA: !If [IsProd, "prod-only", !Ref "AWS::NoValue"]
          QUEUE: !GetAtt Work.QueueName
      Events:
        Hello:
          Type: Api
          Properties: {Path: "/hello/{name}", Method: get}
        Things:
          Type: Api
          Properties: {Path: /things, Method: any}
        Mine:
          Type: Api
          Properties: {Path: /hello/mine, Method: get}
        Custom:
          Type: EventBridgeRule
          Properties:
            EventBusName: !Ref Bus
            Pattern:
              source: [test]
              detail-type: [Ping]
        Tick:
          Type: Schedule
          Properties:
            Schedule: rate(5 minutes)
        Paused:
          Type: Schedule
          Properties:
            Schedule: rate(1 minute)
            Enabled: false
        Alerts:
          Type: SNS
          Properties:
            Topic: !Ref Topic
        Items:
          Type: SQS
          Properties:
            Queue: !GetAtt Work.Arn
            BatchSize: 5
  Serial:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: functions/recorder/
      Handler: app.handler
      ReservedConcurrentExecutions: 1
  Parallel:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: functions/recorder/
      Handler: app.handler
  CompletedJobs:
    Type: AWS::Events::Rule
    Properties:
      EventPattern:
        source: [aws.sagemaker]
        detail:
          TrainingJobStatus: [Completed]
      Targets:
        - {Arn: !GetAtt Serial.Arn, Id: serial}
  Pongs:
    Type: AWS::Events::Rule
    Properties:
      EventBusName: !Ref Bus
      EventPattern:
        source: [test]
        detail-type: [Pong]
      Targets:
        - {Arn: !GetAtt Parallel.Arn, Id: pong-detail, InputPath: $.detail}
        - {Arn: !GetAtt Serial.Arn, Id: pong-constant, Input: '{"constant": true}'}
  Nightly:
    Type: AWS::Events::Rule
    Properties:
      ScheduleExpression: cron(30 2 * * ? *)
      Targets:
        - {Arn: !GetAtt Parallel.Arn, Id: nightly, Input: '{"kind": "nightly"}'}
  BusyAlarm:
    Type: AWS::CloudWatch::Alarm
    Properties:
      AlarmDescription: !Sub "busy ${Env}"
      Namespace: Test
      MetricName: Busy
      Dimensions:
        - {Name: Host, Value: !Sub "${AWS::StackName}/algo-1"}
      Statistic: Average
      Period: 60
      EvaluationPeriods: 3
      DatapointsToAlarm: 2
      Threshold: 10
      ComparisonOperator: LessThanThreshold
      TreatMissingData: notBreaching
      AlarmActions: [!Ref Topic]
Outputs:
  TableName:
    Value: !Ref Table
  TopicArn:
    Value: !Ref Topic
  Joined:
    Value: !Join ["-", !Ref Roles]
  Picked:
    Value: !Select [1, !Split [",", "x,y,z"]]
  Escaped:
    Value: !Sub "${!NotAVariable}-${Required}"
  ProdOnly:
    Condition: IsProd
    Value: prod
"""


@pytest.fixture
def mini_template(tmp_path: Path) -> Path:
    """The test template and its recorder function in a fresh folder."""
    code = tmp_path / "functions" / "recorder"
    code.mkdir(parents=True)
    (code / "app.py").write_text(textwrap.dedent(RECORDER))
    path = tmp_path / "template.yaml"
    path.write_text(TEMPLATE)
    return path


@pytest.fixture(scope="module")
def account_moto() -> Iterator[tuple[str, str]]:
    """A moto server whose every request lands in an account of this module's own."""
    account_id = "210987654321"
    moto = _start_moto(account_id)
    try:
        yield moto.endpoint, account_id
    finally:
        moto.server.shutdown()
        moto.server.server_close()


@pytest.fixture
def aws(account_moto: tuple[str, str]) -> Callable[[str], Any]:
    """boto3 clients on the module's moto."""
    endpoint, _ = account_moto
    made: dict[str, Any] = {}

    def client(service: str) -> Any:
        if service not in made:
            made[service] = boto3.client(service, endpoint_url=endpoint, region_name="us-east-1")
        return made[service]

    return client
