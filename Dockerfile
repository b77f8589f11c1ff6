# syntax=docker/dockerfile:1
# One image that runs every script of cleanrl/, on AWS Batch or anywhere (docs/cloud.md).
#   CPU (default):  docker build -t cleanrl .
#   CUDA:           docker build -t cleanrl:cuda \
#                     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#                     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#                     --build-arg JAX_PACKAGE="jax[cuda12]" .
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG JAX_PACKAGE=jax
ARG JAX_VERSION=0.10.2

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The python bases have Python; the CUDA bases have none. Either way the project gets a venv of its own.
# hadolint ignore=DL3008
RUN if ! python3 -m venv --help > /dev/null 2>&1; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv /opt/venv

WORKDIR /app
# The dependencies in a layer of their own, rebuilt only when they change: torch first, from the index
# of this build's variant (CPU or CUDA), then the project with its extras at the tested versions.
# LICENSE: pyproject's license-files, which setuptools reads when it builds the project.
COPY pyproject.toml README.md LICENSE ./
COPY cloud/constraints.txt cloud/
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}" \
    && pip install --no-cache-dir --constraint cloud/constraints.txt "${JAX_PACKAGE}==${JAX_VERSION}" ".[envpool,jax,mujoco,cloud,benchmark,tune]"
COPY cleanrl/ cleanrl/
COPY cloud/ cloud/
# benchmark/tune.py: an AWS Batch array job of tuners (docs/tuning.md) runs it from here.
COPY benchmark/*.py benchmark/slurm_template.sh benchmark/

# Not root. The scripts stay root's (read-only); the user writes runs/, videos/ and wandb/ in /app.
# On Batch, runs/ and videos/ are the job's EFS volumes (cloud/examples/job_definition.json).
RUN groupadd --gid 10001 cleanrl \
    && useradd --create-home --uid 10001 --gid 10001 cleanrl \
    && mkdir runs videos \
    && chown cleanrl:cleanrl /app runs videos
USER 10001:10001

ENTRYPOINT ["python", "/app/cloud/entrypoint.py"]
CMD ["python", "cleanrl/ppo_atari.py", "--help"]
