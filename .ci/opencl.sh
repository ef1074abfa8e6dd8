#!/bin/sh
# Install PoCL (an OpenCL platform that runs on the CPU) and PyOpenCL, idempotently.
# Called by `make .venv/.opencl`, which never fails on it: when it cannot install, it says
# why, exits 1 (so the stamp is not written and the next `make test` tries again) and the
# OpenCL tests skip with the reason the backend gives.
PY="$1"
if [ ! -e /etc/OpenCL/vendors/pocl.icd ] && ! ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        echo "opencl: no OpenCL ICD and not root: run 'apt-get install -y pocl-opencl-icd ocl-icd-libopencl1'" >&2
    elif ! command -v apt-get >/dev/null 2>&1; then
        echo "opencl: no OpenCL ICD and no apt-get on this machine; OpenCL tests will skip" >&2
    else
        echo "opencl: installing PoCL (pocl-opencl-icd, ocl-icd-libopencl1)"
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q pocl-opencl-icd ocl-icd-libopencl1 >/tmp/burn-remote-apt.log 2>&1; then
            apt-get update -q >/dev/null 2>&1
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q pocl-opencl-icd ocl-icd-libopencl1 >/tmp/burn-remote-apt.log 2>&1 \
                || { echo "opencl: apt-get failed (see /tmp/burn-remote-apt.log):" >&2; tail -3 /tmp/burn-remote-apt.log >&2; }
        fi
    fi
fi
"$PY" -m pip install --quiet -e '.[opencl]' || echo "opencl: pip install of pyopencl failed; OpenCL tests will skip" >&2
"$PY" -c "from burn_remote.engine.backend import get_backend; print('opencl:', get_backend('opencl').device.name)" \
    || { echo "opencl: backend unavailable here; OpenCL tests will skip with the reason" >&2; exit 1; }
