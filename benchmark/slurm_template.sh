#!/bin/bash
# An sbatch array job rendered by benchmark/run.py --slurm from benchmark/slurm_template.sh:
# array task k runs commands[k] (one per command x env id x seed; for benchmark/tune.py --slurm, one
# tuner of the study) and writes its output to LOG_DIR/names[k].log. Submit it with `sbatch THIS_FILE`.
#SBATCH --job-name={{job_name}}
#SBATCH --array={{array}}
#SBATCH --cpus-per-task={{cpus_per_task}}
#SBATCH --time={{time}}
#SBATCH --mem={{mem}}
#SBATCH --output={{output}}
{{optional_options}}
set -euo pipefail

names=(
{{names}}
)
commands=(
{{commands}}
)
processes=(
{{processes}}
)
resumes=(
{{resumes}}
)

task=${SLURM_ARRAY_TASK_ID:?this script runs as a Slurm array job: submit it with sbatch}
cd {{workdir}}
# Each process of the run gets its share of the task's cores (torch and the emulators size their
# thread pools from OMP_NUM_THREADS).
threads=$(( ${SLURM_CPUS_PER_TASK:-1} / processes[task] ))
export OMP_NUM_THREADS=$(( threads > 0 ? threads : 1 ))
export PYTHONUNBUFFERED=1
log={{log_dir}}/${names[task]}.log
echo "task $task: ${names[task]} (OMP_NUM_THREADS=$OMP_NUM_THREADS, output in $log on $(hostname))"
# A command with --resume goes on from its checkpoint when its task is submitted again: its log keeps
# the earlier attempts (their checkpoints, a traceback) and adds this one, as benchmark/run.py's local runs do.
if (( resumes[task] )); then
  echo "# ${commands[task]}" >> "$log"
else
  echo "# ${commands[task]}" > "$log"
fi
bash -c "${commands[task]}" >> "$log" 2>&1
