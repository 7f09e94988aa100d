# Sourced by with-tfconfig and sweep (train.sbatch, run from Slurm's copy, checks alike): sets
# `python` to $TFCONFIG_SLURM_PYTHON, else python3 on PATH, and stops with exit 2 and a hint
# where that is no program or has no tfconfig_slurm, rather than Python's own ModuleNotFoundError.
# $1: the calling script's name, for the message.
python="${TFCONFIG_SLURM_PYTHON:-python3}"
where="TFCONFIG_SLURM_PYTHON: '$python'"
[[ -z ${TFCONFIG_SLURM_PYTHON:-} ]] && where="TFCONFIG_SLURM_PYTHON: unset, and python3 on PATH"
if ! command -v "$python" >/dev/null; then
  echo "$1: $where is not a program. HINT: activate the environment tfconfig-slurm is installed in (source .venv/bin/activate), or set TFCONFIG_SLURM_PYTHON to its python" >&2
  exit 2
fi
# Its word back, not only its status: any program that exits 0 (/usr/bin/true) passed that.
# Its last line: a user's sitecustomize may print first.
if [[ $("$python" -c 'import tfconfig_slurm; print("importable")' 2>/dev/null | tail -n 1) != importable ]]; then
  echo "$1: $where is no Python that imports tfconfig_slurm. HINT: activate the environment tfconfig-slurm is installed in (source .venv/bin/activate), or set TFCONFIG_SLURM_PYTHON to its python" >&2
  exit 2
fi
