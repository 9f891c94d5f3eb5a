#!/bin/sh
# Install fedkit into a virtual environment, in one line (README, "Quick start"):
#
#   sh install.sh && .venv/bin/fedkit run          the core and the bundled method plugins
#   sh install.sh --dev && .venv/bin/pytest        everything, test tools included
#
# PyTorch comes first: on a machine without a GPU, its CPU build from PyTorch's own index
# when that index is reachable (a plain PyPI install brings the CUDA build, several GB the
# machine never uses), else from PyPI; the script says which it used. Settings, from the
# environment: PYTHON (default python3), VENV (default .venv), FEDKIT_TORCH=cpu|pypi (skip
# the check: the CPU index, or PyPI). pip's cache is used as usual.
set -eu

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
CPU_INDEX=https://download.pytorch.org/whl/cpu
PLUGINS="-e plugins/fca -e plugins/fed-lwr -e plugins/priors -e plugins/fed-mas -e plugins/fedhelp -e plugins/baselines"

dev=no
for arg in "$@"; do
    case $arg in
        --dev) dev=yes ;;
        *) echo "install.sh: unknown argument $arg (only --dev)" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip="$VENV/bin/python -m pip"

torch=${FEDKIT_TORCH:-}
if [ -z "$torch" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
        torch=pypi  # a GPU: PyPI's build has CUDA
    elif "$VENV/bin/python" -c "import urllib.request as u; u.urlopen('$CPU_INDEX/torch/', timeout=10)" >/dev/null 2>&1; then
        torch=cpu
    else
        torch=unreachable
    fi
fi
case $torch in
    cpu)
        $pip install torch torchvision --index-url "$CPU_INDEX"
        echo "install.sh: PyTorch's CPU build, from PyTorch's index ($CPU_INDEX)" ;;
    unreachable)
        echo "install.sh: PyTorch's index ($CPU_INDEX) is out of reach: PyTorch from PyPI (its CUDA build: about four times the disk, runs on the CPU the same)" ;;
    pypi)
        echo "install.sh: PyTorch from PyPI (FEDKIT_TORCH=pypi or a GPU found)" ;;
    *) echo "install.sh: FEDKIT_TORCH is cpu or pypi, not $torch" >&2; exit 2 ;;
esac

if [ "$dev" = yes ]; then
    $pip install -r requirements-dev.txt
else
    # shellcheck disable=SC2086  # the plugin flags are words
    $pip install -e . $PLUGINS
fi
echo "install.sh: fedkit is in $VENV ($VENV/bin/fedkit)"
