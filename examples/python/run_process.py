"""Publishes a process, runs it with the Python worker, and reads the
notifications of an agent: muster end to end from Python.

    python3 examples/python/run_process.py --tokens muster-data/tokens.json --process examples/process.yaml \
      --read-notifications-of archive-agent

Publishing and starting are for operators: the operator's token comes from
MUSTER_TOKEN, else from --operator-token-file (by default the local
operator's token that `muster up` keeps in muster-data/operator.token). The
agents authenticate with their own roster tokens (--tokens).

Exits 0 when the execution completed.
"""

import argparse
import json
import os
import sys
import time

import grpc
from google.protobuf import json_format, struct_pb2

from muster.common.v1 import common_pb2
from muster.execution.v1 import execution_pb2, execution_pb2_grpc
from muster.notifier.v1 import notifier_pb2, notifier_pb2_grpc
from muster_worker import Worker


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execution", default="127.0.0.1:50051")
    parser.add_argument("--notifier", default="127.0.0.1:50054")
    parser.add_argument("--tokens", required=True, help="JSON: agent id to roster token")
    parser.add_argument("--process", required=True, help="the process YAML")
    parser.add_argument("--inputs", default="{}", help="the execution's inputs, a JSON object")
    parser.add_argument("--read-notifications-of", default=None, help="an agent whose inbox to print, as the agent")
    parser.add_argument("--operator-token-file", default="muster-data/operator.token")
    args = parser.parse_args()

    with open(args.tokens) as file:
        credentials = json.load(file)
    with open(args.process) as file:
        source = file.read()
    operator_token = os.environ.get("MUSTER_TOKEN")
    if not operator_token:
        with open(args.operator_token_file) as file:
            operator_token = file.read().strip()
    as_operator = [("authorization", f"Bearer {operator_token}")]

    worker = Worker(args.execution, credentials).start()
    try:
        execution = execution_pb2_grpc.ExecutionServiceStub(grpc.insecure_channel(args.execution))
        try:
            published = execution.PublishProcess(
                execution_pb2.PublishProcessRequest(source=source, file_name=args.process), metadata=as_operator
            )
        except grpc.RpcError as error:
            print(f"publish refused: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
        process = published.process
        print(f"published {process.name} version {process.version}")
        started = execution.StartExecution(
            execution_pb2.StartExecutionRequest(
                process_name=process.name,
                process_version=process.version,
                inputs=json_format.ParseDict(json.loads(args.inputs), struct_pb2.Struct()),
            ),
            metadata=as_operator,
        ).execution
        print(f"execution {started.id} started")
        finished = None
        watch = execution_pb2.WatchExecutionRequest(execution_id=started.id)
        for response in execution.WatchExecution(watch, metadata=as_operator):
            event = response.event
            print(f"  {common_pb2.EventType.Name(event.event_type):<32} {event.step_id} {event.agent_id}")
            if event.event_type == common_pb2.EVENT_TYPE_EXECUTION_FINISHED:
                finished = event
                break
    finally:
        worker.stop()
    completed = finished is not None and finished.execution_status == common_pb2.EXECUTION_STATUS_COMPLETED
    print(f"execution {'completed' if completed else 'did not complete'}; the Python worker ran {worker.handled} steps")

    if args.read_notifications_of:
        notifier = notifier_pb2_grpc.NotifierServiceStub(grpc.insecure_channel(args.notifier))
        # An agent reads its own inbox, with its own token.
        as_agent = [("authorization", f"Bearer {credentials[args.read_notifications_of]}")]
        deadline = time.monotonic() + 30
        while True:
            page = notifier.ListNotifications(
                notifier_pb2.ListNotificationsRequest(agent_id=args.read_notifications_of, limit=1000),
                metadata=as_agent,
            )
            mine = [n for n in page.notifications if n.event.execution_id == started.id]
            if any(n.event.event_type == common_pb2.EVENT_TYPE_STEP_COMPLETED for n in mine) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for notification in mine:
            event = notification.event
            print(f"notification {notification.cursor} for {notification.agent_id}: "
                  f"{common_pb2.EventType.Name(event.event_type)} {event.step_id}: {notification.output_summary[:60]}")
        if not mine:
            print(f"no notification reached {args.read_notifications_of}", file=sys.stderr)
            return 1
    return 0 if completed else 1


if __name__ == "__main__":
    sys.exit(main())
