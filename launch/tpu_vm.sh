#!/usr/bin/env bash
# Run a rossjax command on every worker of a Cloud TPU VM slice.
#
#   launch/tpu_vm.sh create  NAME ZONE [ACCELERATOR] [VERSION]   # e.g. v5litepod-8 v2-alpha-tpuv5-lite
#   launch/tpu_vm.sh setup   NAME ZONE                            # copy this checkout, build .venv with rossjax[tpu]
#   launch/tpu_vm.sh run     NAME ZONE -- rossjax train --config=configs/ross_sft.py --workdir=gs://...
#   launch/tpu_vm.sh logs    NAME ZONE                            # follow the latest run's log again
#   launch/tpu_vm.sh stop    NAME ZONE                            # SIGTERM: the trainer checkpoints, exits
#   launch/tpu_vm.sh delete  NAME ZONE
#
# `run` survives a dropped SSH connection: on each worker the command runs detached (setsid +
# nohup, stdin closed) with its output in ~/rossjax/logs/run-TIME.log; the SSH session only
# follows that log (until the command ends) and can be dropped or Ctrl-C'd at any time. `logs`
# follows it again; the exit status is the log's last line.
# Multi-host slices: every worker runs the same command; `--config.distributed.enabled=True`
# makes each process call jax.distributed.initialize(), which discovers its peers on TPU VMs
# (rossjax train and rossjax grpo; the probe reward and rossjax extract are one-host).
# Preemption: the trainer checkpoints on SIGTERM and resumes from the latest step on restart.
set -euo pipefail
cmd=${1:?create|setup|run|logs|stop|delete}; name=${2:?NAME}; zone=${3:?ZONE}; shift 3 || true
ssh_all() { gcloud compute tpus tpu-vm ssh "$name" --zone "$zone" --worker=all --command "$1"; }
# The remote follower: the newest log, printed from its start until its command has exited.
follow='cd ~/rossjax && log=$(ls -t logs/run-*.log | head -1) && pid=$(cat logs/run.pid) &&
  tail -n +1 -F --pid="$pid" "$log" 2>/dev/null'
case "$cmd" in
  create)
    gcloud compute tpus tpu-vm create "$name" --zone "$zone" \
      --accelerator-type "${1:-v5litepod-8}" --version "${2:-v2-alpha-tpuv5-lite}" ;;
  setup)
    git archive --format=tar.gz -o /tmp/rossjax.tgz HEAD
    gcloud compute tpus tpu-vm scp /tmp/rossjax.tgz "$name":~/rossjax.tgz --zone "$zone" --worker=all
    ssh_all 'mkdir -p rossjax && tar xzf rossjax.tgz -C rossjax && cd rossjax && python3 -m venv .venv &&
       .venv/bin/pip install -q -e ".[tpu]"' ;;
  run)
    [ "${1:-}" = "--" ] && shift
    [ $# -gt 0 ] || { echo "usage: $0 run NAME ZONE -- rossjax COMMAND ..." >&2; exit 2; }
    # The command, quoted once for the remote shell and once more for the detached `bash -c`.
    job=$(printf '%q' ".venv/bin/$(printf '%q ' "$@"); echo \"[exit \$?]\"")
    ssh_all "set -e; cd ~/rossjax; mkdir -p logs; log=logs/run-\$(date +%Y%m%d-%H%M%S).log
      nohup setsid bash -c $job > \$log 2>&1 < /dev/null &
      echo \$! > ~/rossjax/logs/run.pid; sleep 1; $follow" ;;
  logs)
    ssh_all "$follow" ;;
  stop)
    # Only the command (the detached shell's child): the shell then logs its exit status.
    ssh_all 'cd ~/rossjax && pkill -TERM -P "$(cat logs/run.pid)"' ;;
  delete)
    gcloud compute tpus tpu-vm delete "$name" --zone "$zone" --quiet ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
