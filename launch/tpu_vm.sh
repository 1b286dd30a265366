#!/usr/bin/env bash
# Run a rossjax command on every worker of a Cloud TPU VM slice.
#
#   launch/tpu_vm.sh create  NAME ZONE [ACCELERATOR] [VERSION]   # e.g. v5litepod-8 v2-alpha-tpuv5-lite
#   launch/tpu_vm.sh setup   NAME ZONE                            # copy this checkout, build .venv with jax[tpu]
#   launch/tpu_vm.sh run     NAME ZONE -- rossjax train --config=configs/ross_sft.py --workdir=gs://...
#   launch/tpu_vm.sh delete  NAME ZONE
#
# Multi-host slices: every worker runs the same command; `--config.distributed.enabled=True`
# makes each process call jax.distributed.initialize(), which discovers its peers on TPU VMs
# (rossjax train and rossjax grpo; the probe reward and rossjax extract are one-host).
# Preemption: the trainer checkpoints on SIGTERM and resumes from the latest step on restart.
set -euo pipefail
cmd=${1:?create|setup|run|delete}; name=${2:?NAME}; zone=${3:?ZONE}; shift 3 || true
case "$cmd" in
  create)
    gcloud compute tpus tpu-vm create "$name" --zone "$zone" \
      --accelerator-type "${1:-v5litepod-8}" --version "${2:-v2-alpha-tpuv5-lite}" ;;
  setup)
    git archive --format=tar.gz -o /tmp/rossjax.tgz HEAD
    gcloud compute tpus tpu-vm scp /tmp/rossjax.tgz "$name":~/rossjax.tgz --zone "$zone" --worker=all
    gcloud compute tpus tpu-vm ssh "$name" --zone "$zone" --worker=all --command \
      'mkdir -p rossjax && tar xzf rossjax.tgz -C rossjax && cd rossjax && python3 -m venv .venv &&
       .venv/bin/pip install -q -e . && .venv/bin/pip install -q "jax[tpu]"' ;;
  run)
    [ "${1:-}" = "--" ] && shift
    gcloud compute tpus tpu-vm ssh "$name" --zone "$zone" --worker=all --command \
      "cd rossjax && .venv/bin/$*" ;;
  delete)
    gcloud compute tpus tpu-vm delete "$name" --zone "$zone" --quiet ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
