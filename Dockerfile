# The grading image (SPEC §6): one grade per fresh container, no network, read-only root,
# non-root user, one GPU. Every version is pinned because budgets and timings depend on them.
# Build on a GPU host (our dev/CI machines have no Docker engine):
#   docker build -t dilated-block-grader:0.1.0 .
#   docker run --rm --gpus '"device=0"' --network none --read-only --tmpfs /tmp \
#     -v /path/to/workspace:/workspace:ro dilated-block-grader:0.1.0 grade /workspace

# CUDA 13.0 user space matches the torch 2.11.0 wheel (a cu130 build; needs an R580+ driver).
FROM nvidia/cuda:13.0.2-base-ubuntu24.04

# Triton compiles a small C launcher with the host compiler the first time a kernel runs;
# git reads the submitted commit.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv gcc libc6-dev git \
    && rm -rf /var/lib/apt/lists/*

# torch last-pinned with its own CUDA libraries; triton is the one torch 2.11.0 requires.
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir \
        torch==2.11.0 triton==3.6.0 "numpy<2.6" pyyaml==6.0.3 nvidia-ml-py==13.580.82 matplotlib==3.10.7
ENV PATH=/opt/venv/bin:$PATH

# Triton's cache must be writable under a read-only root: point it at the tmpfs.
ENV TRITON_CACHE_DIR=/tmp/triton-cache

COPY task/ /opt/grader/task/
COPY grader/ /opt/grader/grader/
COPY reference/ /opt/grader/reference/
COPY scoring.yaml /opt/grader/scoring.yaml
WORKDIR /opt/grader

# The grade runs as an unprivileged user; submission code runs in its children with less still.
RUN useradd --create-home --uid 10001 grader
USER grader

ENTRYPOINT ["python3", "-m", "grader"]
