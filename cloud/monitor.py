"""Lists the jobs of a sweep submitted by cloud/submit.py with their states; with `--wait`, waits
until every job has ended and exits non-zero naming the jobs that failed.

    python cloud/monitor.py --sweep-id SWEEP_ID                 # one listing
    python cloud/monitor.py --sweep-id SWEEP_ID --wait          # a line per change, until all end

Credentials and region come from the standard AWS configuration. Docs: docs/cloud.md
"""

import argparse
import math
import time
from collections import Counter

from batch import (
    SWEEP_TAG,
    Parser,
    add_endpoint_argument,
    aws_errors,
    batch_client,
    check_sweep_id,
    fail,
    require_job_queue,
    sweep_filter,
)

ENDED = ("SUCCEEDED", "FAILED")
# Batch's order of a job's life, for the summary line.
STATES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")


def sweep_jobs(client, job_queue: str, sweep_id: str) -> list[dict]:
    """The sweep's jobs, described, in name order: found by name prefix, kept if tagged with the sweep."""
    with aws_errors():
        job_ids = [
            summary["jobId"]
            for page in client.get_paginator("list_jobs").paginate(jobQueue=job_queue, filters=sweep_filter(sweep_id))
            for summary in page["jobSummaryList"]
        ]
        jobs = []
        for start in range(0, len(job_ids), 100):  # DescribeJobs takes at most 100 ids
            jobs += client.describe_jobs(jobs=job_ids[start : start + 100])["jobs"]
    # The name filter ignores case; the tag does not.
    return sorted((job for job in jobs if job.get("tags", {}).get(SWEEP_TAG) == sweep_id), key=lambda j: j["jobName"])


def job_line(job: dict) -> str:
    attempts = len(job.get("attempts", []))
    line = f"  {job['jobName']}  {job['status']}  attempts {attempts}"
    if job.get("statusReason"):
        line += f"  ({job['statusReason']})"
    return line


def summary(jobs: list[dict]) -> str:
    counts = Counter(job["status"] for job in jobs)
    return ", ".join(f"{counts[state]} {state}" for state in STATES if counts[state])


def failed_jobs_error(sweep_id: str, jobs: list[dict]):
    failed = [job for job in jobs if job["status"] == "FAILED"]
    if failed:
        names = ", ".join(
            job["jobName"] + (f" ({job['statusReason']})" if job.get("statusReason") else "") for job in failed
        )
        fail(f"{len(failed)} of {len(jobs)} jobs of sweep {sweep_id} failed: {names}")


def main():
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep-id", required=True, help="the sweep id that cloud/submit.py printed")
    parser.add_argument("--job-queue", default="cleanrl-queue", help="the sweep's job queue (default: cleanrl-queue)")
    parser.add_argument(
        "--wait", action="store_true", help="wait until every job has ended; exit non-zero naming the failed ones"
    )
    parser.add_argument(
        "--interval", type=float, default=60.0, help="seconds between two looks with --wait (default: 60)"
    )
    add_endpoint_argument(parser)
    cli = parser.parse_args()
    check_sweep_id(cli.sweep_id)
    if not (math.isfinite(cli.interval) and cli.interval > 0):
        fail(f"--interval must be a positive number of seconds, not {cli.interval}")

    client = batch_client(cli.endpoint_url)
    require_job_queue(client, cli.job_queue)
    jobs = sweep_jobs(client, cli.job_queue, cli.sweep_id)
    if not jobs:
        fail(
            f"no jobs of sweep {cli.sweep_id} in job queue {cli.job_queue} "
            "(Batch lists ended jobs for a limited time only)"
        )
    print(f"sweep {cli.sweep_id} in {cli.job_queue}: {len(jobs)} job{'s' if len(jobs) > 1 else ''}", flush=True)
    for job in jobs:
        print(job_line(job), flush=True)
    print(f"{time.strftime('%H:%M:%S')} {summary(jobs)}", flush=True)
    if not cli.wait:
        return

    # Plain lines, for a log nobody watches: a job's line when its state changes, then the counts. Each
    # job is judged on its last state seen: a job that ended may drop out of a later listing (Batch
    # lists ended jobs for a limited time only), and a failure stays a failure.
    seen = {job["jobId"]: job for job in jobs}
    while not all(job["status"] in ENDED for job in seen.values()):
        time.sleep(cli.interval)
        changed = [
            job
            for job in sweep_jobs(client, cli.job_queue, cli.sweep_id)
            if job["jobId"] not in seen or seen[job["jobId"]]["status"] != job["status"]
        ]
        seen.update((job["jobId"], job) for job in changed)
        for job in changed:
            print(job_line(job), flush=True)
        if changed:
            print(f"{time.strftime('%H:%M:%S')} {summary(list(seen.values()))}", flush=True)
    jobs = sorted(seen.values(), key=lambda j: j["jobName"])
    failed_jobs_error(cli.sweep_id, jobs)
    print(f"sweep {cli.sweep_id}: all {len(jobs)} jobs succeeded")


if __name__ == "__main__":
    main()
