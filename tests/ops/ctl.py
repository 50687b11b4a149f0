# SPDX-License-Identifier: Apache-2.0
"""What the tests of regenctl share: running it against a test regend, and
reading what `regenctl metrics` prints."""
import os
import re
import subprocess

from regend_fixture import TIME_SCALE, call, check, log


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


# The text exposition format, version 0.0.4.
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(r"^(%s)(\{(?:%s(?:,%s)*)?\})? (\S+)(?: -?\d+)?$" % (NAME, LABEL, LABEL))
HELP = re.compile(r"^# HELP (%s) (.*)$" % NAME)
TYPE = re.compile(r"^# TYPE (%s) (counter|gauge|histogram|summary|untyped)$" % NAME)


def unescape(value):
    """A label value as written (backslash, double quote and line feed
    escaped) to the value it stands for."""
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse_metrics(text):
    """{(name, frozenset(labels)): value}, checking the grammar: every line
    a HELP, a TYPE or a sample; a TYPE before its family's samples, once;
    a family's samples together; values floats. Label values are given
    unescaped."""
    check(text.endswith("\n"), "the exposition does not end with a line feed: %r" % text[-200:])
    samples, types, done, current = {}, {}, set(), None
    for line in text.splitlines():
        m = HELP.match(line)
        if m:
            continue
        m = TYPE.match(line)
        if m:
            check(m.group(1) not in types, "TYPE of %s twice" % m.group(1))
            types[m.group(1)] = m.group(2)
            continue
        check(not line.startswith("#") and line.strip(), "not a line of the format: %r" % line)
        m = SAMPLE.match(line)
        check(m, "not a sample: %r" % line)
        name = m.group(1)
        family = re.sub(r"_(sum|count|bucket)$", "", name) if re.sub(r"_(sum|count|bucket)$", "", name) in types \
            else name
        check(family in types, "%s has no TYPE before its samples" % name)
        if family != current:
            check(family not in done, "the samples of %s are not together" % family)
            if current:
                done.add(current)
            current = family
        labels = frozenset((k, unescape(v)) for k, v in
                           re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        key = (name, labels)
        check(key not in samples, "sample %s twice" % line)
        value = m.group(3)
        check(re.match(r"^([+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?)|[+-]?Inf|NaN)$", value),
              "not a float: %r" % line)
        samples[key] = float(value)
    return samples, types


def dev(samples, name, device, **labels):
    want = frozenset([("device", str(device))] + [(k, str(v)) for k, v in labels.items()])
    for (n, l), v in samples.items():
        if n == name and want <= l:
            return v
    return None
