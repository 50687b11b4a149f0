"""What the tests of regenctl share: running it against a test regend."""
import os
import subprocess

from regend_fixture import TIME_SCALE, call, log


def run(regenctl, d, *args, env=None, timeout=60):
    """regenctl ARGS against regend d (None: no --socket); returns
    (exit code, stdout, stderr). env replaces the job variables: the test's
    own environment has none of them."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
                         "SLURM_JOB_ID", "POD_NAME", "POD_UID")}
    full.update(env or {})
    argv = [regenctl] + (["--socket", d.socket] if d is not None else []) + list(args)
    p = subprocess.run(argv, capture_output=True, text=True, env=full, timeout=timeout * TIME_SCALE)
    log("regenctl %s -> %d\n%s%s" % (" ".join(args), p.returncode, p.stdout, p.stderr))
    return p.returncode, p.stdout, p.stderr


def generations(d):
    return [dev["generation"] for dev in call(d.socket, "io.regen.Device.Status")["devices"]]
