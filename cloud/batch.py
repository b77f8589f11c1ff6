"""What cloud/submit.py and cloud/monitor.py share: user errors, the Batch client, the job queue
check and the names and tags of a sweep's jobs. Docs: docs/cloud.md"""

import argparse
import contextlib
import os
import re
import sys

import boto3
import botocore.exceptions

SWEEP_TAG = "cleanrl:sweep"
# A sweep id names its jobs `{sweep_id}__{env}__{seed}`; without "__" in it, the prefix `{sweep_id}__`
# belongs to that sweep alone.
SWEEP_ID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_))*$")
MAX_JOB_NAME = 128


def fail(message: str):
    sys.exit(f"error: {message}")


class Parser(argparse.ArgumentParser):
    """argparse with the house's one-line errors."""

    def error(self, message):
        fail(f"{message} (see --help)")


def add_endpoint_argument(parser: argparse.ArgumentParser):
    parser.add_argument(
        "--endpoint-url",
        help="the Batch endpoint, e.g. a local test server "
        "(default: AWS_ENDPOINT_URL, else AWS's endpoint of the region)",
    )


def batch_client(endpoint_url: str | None):
    """A Batch client from the standard AWS configuration (environment, ~/.aws, instance role). The
    region is AWS_DEFAULT_REGION or the profile's, else AWS_REGION (which botocore itself does not read)."""
    with aws_errors():  # a misspelled AWS_PROFILE, say
        session = boto3.Session()
        if session.region_name is None and os.environ.get("AWS_REGION"):
            session = boto3.Session(region_name=os.environ["AWS_REGION"])
        if session.region_name is None:
            fail("no AWS region: set AWS_DEFAULT_REGION (or AWS_REGION), or a region in ~/.aws/config (aws configure)")
        if session.get_credentials() is None:
            fail(
                "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, "
                "or run aws configure"
            )
        try:
            return session.client("batch", endpoint_url=endpoint_url)
        except ValueError as e:  # botocore's "Invalid endpoint: localhost:1"
            fail(f"{e} (--endpoint-url or AWS_ENDPOINT_URL): give a URL with its scheme, e.g. http://localhost:5000")


@contextlib.contextmanager
def aws_errors():
    """An error from AWS (a refused call, an unreachable endpoint) is a one-line error, not a traceback."""
    try:
        yield
    except botocore.exceptions.ClientError as e:
        error = e.response.get("Error", {})
        fail(f"AWS Batch refused {e.operation_name}: {error.get('Message') or error.get('Code') or e}")
    except botocore.exceptions.BotoCoreError as e:
        fail(f"AWS: {e}")


def require_job_queue(client, job_queue: str):
    with aws_errors():
        queues = client.describe_job_queues(jobQueues=[job_queue])["jobQueues"]
    if not queues:
        fail(
            f"job queue {job_queue!r} does not exist in region {client.meta.region_name}: pass --job-queue, or create "
            "it (aws batch create-job-queue --cli-input-json file://cloud/examples/job_queue.json)"
        )
    return queues[0]


def check_sweep_id(sweep_id: str):
    if not SWEEP_ID.match(sweep_id) or len(sweep_id) > 64:
        fail(f"sweep id {sweep_id!r}: use up to 64 letters, digits, - and single _ (no __)")


def job_name(sweep_id: str, env_id: str, seed: int) -> str:
    name = f"{sweep_id}__{re.sub(r'[^A-Za-z0-9_-]', '_', env_id)}__{seed}"
    if len(name) > MAX_JOB_NAME:
        fail(f"job name {name!r} is longer than Batch's {MAX_JOB_NAME} characters: use a shorter --sweep-id")
    return name


def sweep_filter(sweep_id: str) -> list[dict]:
    """The ListJobs filter that finds a sweep's jobs (in any state) by their name prefix."""
    return [{"name": "JOB_NAME", "values": [f"{sweep_id}__*"]}]
