#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Kubernetes deployment as files: they parse, say what the docs say,
and the Helm chart renders what the plain manifest holds.

- Every manifest (deploy/kubernetes, docs/examples/kubernetes) parses as
  YAML (Debian's python3-yaml), each document a Kubernetes object.
- The workload pods (the training pod, the maintenance Job) reach regend
  through regen.io/socket, never a hostPath: the training pod passes the
  Pod Security baseline and restricted levels as they are written (checked
  here rule by rule); only regen-system, labelled privileged, has hostPaths.
- regend's DaemonSet: the NVIDIA runtime and NVIDIA_VISIBLE_DEVICES=all
  give it the node's driver and GPUs, and it takes no nvidia.com/gpu; its
  socket is in the /run/regen it shares; the socket plugin mounts that
  folder read-only as regen.io/socket; its probes are regenctl's; NVRx's
  health check (regen-nvrx-health) runs beside it, its socket there too.
- deploy/Containerfile: no NVIDIA driver in the image (the toolkit mounts
  the host's), the variables that ask for it, the groups with the gids the
  pods name, regend as the entry point.
- deploy/helm/regen: Chart.yaml's appVersion is meson's version; the
  templates, rendered here with the chart's values (helm is not a Debian
  package: a small renderer for the template language the chart uses),
  give the plain manifest's objects; other values are substituted where
  they belong.

Usage: test_kubernetes_manifests.py SOURCE_ROOT
"""
import copy
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import check, log, skip

try:
    import yaml
except ImportError:
    skip("no PyYAML for this python3 (Debian: python3-yaml)")


# ---- Helm's template language, the part the chart uses ----------------------

ACTION = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.S)


def tokens(text):
    """Text and actions, with {{- and -}} trimming the whitespace beside them."""
    out, pos = [], 0
    for m in ACTION.finditer(text):
        before = text[pos:m.start()]
        if m.group(1):
            before = before.rstrip(" \t\n")
        out.append(("text", before))
        out.append(("action", m.group(2), bool(m.group(3))))
        pos = m.end()
    out.append(("text", text[pos:]))
    # A right trim eats the whitespace that starts the next text.
    for i, t in enumerate(out):
        if t[0] == "action" and t[2] and i + 1 < len(out):
            out[i + 1] = ("text", out[i + 1][1].lstrip(" \t\n"))
    return out


def lookup(ctx, path):
    value = ctx
    for part in path.strip(".").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def evaluate(ctx, expr):
    stages = [s.strip() for s in expr.split("|")]
    value = None
    for n, stage in enumerate(stages):
        words = stage.split()
        if n == 0 and words[0].startswith("."):
            value = lookup(ctx, words[0])
            continue
        func, args = words[0], [lookup(ctx, a) if a.startswith(".") else a for a in words[1:]]
        if n > 0:
            args.append(value)
        if func == "quote":
            value = json.dumps(str(args[-1]))
        elif func == "toYaml":
            value = yaml.safe_dump(args[-1], default_flow_style=False, sort_keys=False).rstrip("\n")
        elif func in ("nindent", "indent"):
            pad = " " * int(args[0])
            value = ("\n" if func == "nindent" else "") + "\n".join(pad + l for l in str(args[-1]).split("\n"))
        else:
            raise ValueError("the test's renderer knows no %r: teach it, or keep the chart simpler" % func)
    return value


def render(text, ctx):
    out, stack = [], [True]
    for t in tokens(text):
        if t[0] == "text":
            if all(stack):
                out.append(t[1])
            continue
        expr = t[1]
        if expr.startswith("/*") and expr.endswith("*/"):
            continue
        if expr.startswith("if "):
            value = evaluate(ctx, expr[3:])
            stack.append(bool(value))
        elif expr == "else":
            stack[-1] = not stack[-1]
        elif expr == "end":
            stack.pop()
        elif all(stack):
            value = evaluate(ctx, expr)
            out.append("" if value is None else str(value))
    check(stack == [True], "unbalanced if/end in a template")
    return "".join(out)


def render_chart(chart, values, namespace="regen-system"):
    meta = yaml.safe_load(open(os.path.join(chart, "Chart.yaml")))
    ctx = {"Values": values, "Release": {"Name": "regen", "Namespace": namespace},
           "Chart": {"Name": meta["name"], "Version": meta["version"], "AppVersion": meta["appVersion"]}}
    docs = []
    for path in sorted(glob.glob(os.path.join(chart, "templates", "*.yaml"))):
        docs += [d for d in yaml.safe_load_all(render(open(path).read(), ctx)) if d]
    return docs


# ---- Pod Security Standards, the rules a pod spec can break ------------------

BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def containers(spec):
    return spec.get("initContainers", []) + spec.get("containers", []) + spec.get("ephemeralContainers", [])


def baseline(spec):
    """What in a pod spec the baseline level forbids."""
    bad = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            bad.append(key)
    bad += ["hostPath volume %s" % v["name"] for v in spec.get("volumes", []) if "hostPath" in v]
    for c in containers(spec):
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            bad.append("%s: privileged" % c["name"])
        extra = set(sc.get("capabilities", {}).get("add", [])) - BASELINE_CAPS
        if extra:
            bad.append("%s: capabilities %s" % (c["name"], sorted(extra)))
        if any(p.get("hostPort") for p in c.get("ports", [])):
            bad.append("%s: hostPort" % c["name"])
        if sc.get("procMount", "Default") != "Default":
            bad.append("%s: procMount" % c["name"])
        if sc.get("seccompProfile", {}).get("type") == "Unconfined":
            bad.append("%s: seccomp Unconfined" % c["name"])
    if spec.get("securityContext", {}).get("seccompProfile", {}).get("type") == "Unconfined":
        bad.append("seccomp Unconfined")
    if spec.get("securityContext", {}).get("sysctls"):
        bad.append("sysctls")
    return bad


def restricted(spec):
    """What the restricted level forbids beyond baseline."""
    bad = baseline(spec)
    bad += ["volume %s of a kind restricted forbids" % v["name"] for v in spec.get("volumes", [])
            if not (set(v) - {"name"}) <= RESTRICTED_VOLUMES]
    pod = spec.get("securityContext", {})
    for c in containers(spec):
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation", True):
            bad.append("%s: allowPrivilegeEscalation" % c["name"])
        if not sc.get("runAsNonRoot", pod.get("runAsNonRoot")):
            bad.append("%s: runAsNonRoot" % c["name"])
        if sc.get("runAsUser", pod.get("runAsUser")) == 0:
            bad.append("%s: runAsUser 0" % c["name"])
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            bad.append("%s: capabilities not dropped" % c["name"])
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append("%s: capabilities added" % c["name"])
        if sc.get("seccompProfile", pod.get("seccompProfile", {})).get("type") not in ("RuntimeDefault", "Localhost"):
            bad.append("%s: seccomp" % c["name"])
    return bad


def pod_spec(obj):
    if obj["kind"] == "Pod":
        return obj["spec"]
    if obj["kind"] in ("Job", "DaemonSet", "Deployment"):
        return obj["spec"]["template"]["spec"]
    return None


def main():
    source = os.path.abspath(sys.argv[1])
    deploy = os.path.join(source, "deploy")
    objs = {}
    for path in sorted(glob.glob(os.path.join(deploy, "kubernetes", "*.yaml")) +
                       glob.glob(os.path.join(source, "docs", "examples", "kubernetes", "*.yaml"))):
        # The maintenance Job is an envsubst template: ${NODE}, ${DEVICES}.
        text = open(path).read().replace("${NODE}", "gpu-node-17").replace("${DEVICES}", "0,1")
        docs = [d for d in yaml.safe_load_all(text) if d]
        check(docs, "%s holds no object" % path)
        for d in docs:
            check(isinstance(d, dict) and d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"),
                  "%s: not a Kubernetes object: %r" % (path, d))
        objs[os.path.relpath(path, source)] = docs
    log("parsed %s" % ", ".join("%s (%d)" % (p, len(d)) for p, d in objs.items()))

    # Workloads: regen.io/socket, never a hostPath.
    pod = objs["docs/examples/kubernetes/regen-training-pod.yaml"][0]
    job = objs["docs/examples/kubernetes/regen-gpu-maintenance.yaml"][0]
    for obj in (pod, job):
        spec = pod_spec(obj)
        check(not [v for v in spec.get("volumes", []) if "hostPath" in v], "%s mounts a hostPath" % obj["metadata"])
        for c in containers(spec):
            if any(e.get("name") == "REGEN_SOCKET" for e in c.get("env", [])):
                check(c.get("resources", {}).get("limits", {}).get("regen.io/socket") == 1,
                      "%s reaches regend without asking for regen.io/socket" % c["name"])
    check(baseline(pod_spec(pod)) == [], "the training pod breaks Pod Security baseline: %s" % baseline(pod_spec(pod)))
    check(restricted(pod_spec(pod)) == [], "the training pod breaks restricted: %s" % restricted(pod_spec(pod)))
    check(970 in pod["spec"]["securityContext"]["supplementalGroups"] and
          971 in pod["spec"]["securityContext"]["supplementalGroups"], "the pod lacks the groups' gids")
    log("workloads: regen.io/socket, no hostPath; the training pod passes baseline and restricted")

    # regend's DaemonSet.
    plain = objs["deploy/kubernetes/regend.yaml"]
    ns = [o for o in plain if o["kind"] == "Namespace"][0]
    ds = [o for o in plain if o["kind"] == "DaemonSet"][0]
    check(ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged" and
          ds["metadata"]["namespace"] == ns["metadata"]["name"], "regend's namespace")
    spec = ds["spec"]["template"]["spec"]
    check(spec.get("runtimeClassName") == "nvidia", "regend does not run under the NVIDIA runtime")
    byname = {c["name"]: c for c in spec["containers"]}
    regend, plugin = byname["regend"], byname["socket-plugin"]
    env = {e["name"]: e.get("value") for e in regend["env"]}
    check(env.get("NVIDIA_VISIBLE_DEVICES") == "all" and {"compute", "utility"} <=
          set(env.get("NVIDIA_DRIVER_CAPABILITIES", "").split(",")), "regend's NVIDIA variables: %s" % env)
    for c in spec["containers"]:
        check("nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}), "%s takes GPUs from the jobs" % c["name"])
    args = regend["args"]
    sock = args[args.index("--socket") + 1]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in regend["volumeMounts"]}
    check(os.path.dirname(sock) == mounts["run-regen"]["mountPath"] == volumes["run-regen"]["hostPath"]["path"],
          "regend's socket %s is not in the folder it shares" % sock)
    device = json.loads(plugin["args"][plugin["args"].index("--device") + 1])
    domain = plugin["args"][plugin["args"].index("--domain") + 1]
    check("%s/%s" % (domain, device["name"]) == "regen.io/socket", "the plugin's resource: %s/%s" % (domain, device))
    paths = device["groups"][0]["paths"]
    check(paths == [{"path": volumes["run-regen"]["hostPath"]["path"], "type": "Mount", "readOnly": True}],
          "the plugin does not mount the socket folder read-only: %s" % paths)
    check(device["groups"][0]["count"] >= 1, "the plugin's count")
    pmounts = {m["name"]: m for m in plugin["volumeMounts"]}
    check(pmounts["run-regen"]["mountPath"] == paths[0]["path"] and pmounts["run-regen"].get("readOnly"),
          "the plugin does not see the socket folder where it looks for it")
    check(volumes[pmounts["device-plugins"]["name"]]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins",
          "the plugin's socket is not the kubelet's device-plugins folder")
    for probe in ("readinessProbe", "livenessProbe"):
        command = regend[probe]["exec"]["command"]
        check(command[0] == "regenctl" and sock in command, "%s: %s" % (probe, command))
    check(regend["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}, "regend's capabilities")
    # NVRx's node health check beside regend, its socket where the pods
    # that have regen.io/socket see regend's.
    nvrx = byname["nvrx-health"]
    nargs = nvrx["args"]
    check(nvrx["command"] == ["regen-nvrx-health"] and nvrx["image"] == regend["image"],
          "the NVRx health check's container: %s" % nvrx)
    check(nargs[nargs.index("--regend-socket") + 1] == sock and
          os.path.dirname(nargs[nargs.index("--socket") + 1]) == os.path.dirname(sock) and
          {m["name"]: m["mountPath"] for m in nvrx["volumeMounts"]}.get("run-regen") == os.path.dirname(sock),
          "the NVRx health check's sockets: %s" % nargs)
    log("DaemonSet: NVIDIA runtime, all GPUs without taking any, the socket folder shared read-only")

    # The image.
    cf = open(os.path.join(deploy, "Containerfile")).read()
    check(re.search(r"^FROM debian:12", cf, re.M), "the image is not Debian 12's")
    installs = " ".join(re.findall(r"apt-get install[^\n]*(?:\\\n[^\n]*)*", cf))
    for driver in ("nvidia-driver", "libcuda1", "libnvidia-compute", "cuda-drivers", "nvidia-open"):
        check(driver not in installs, "the image installs the driver (%s): the toolkit mounts the host's" % driver)
    check(re.search(r"NVIDIA_VISIBLE_DEVICES=all", cf) and re.search(r"NVIDIA_DRIVER_CAPABILITIES=compute,utility", cf),
          "the image does not ask the toolkit for the driver")
    gids = dict(re.findall(r"^ARG (REGEN(?:_ADMIN)?_GID)=(\d+)$", cf, re.M))
    check(gids == {"REGEN_GID": "970", "REGEN_ADMIN_GID": "971"}, "the image's gids: %s" % gids)
    for pkg in ("regen_", "libregen0_", "regen-cuda_", "python3-regen_"):
        check("/src/%s*.deb" % pkg in cf, "the image does not install the %s package" % pkg.rstrip("_"))
    check("python3-grpcio" in installs, "the image lacks python3-grpcio (regen-nvrx-health)")
    check('ENTRYPOINT ["/usr/sbin/regend"]' in cf and '"--socket", "/run/regen/regend.sock"' in cf, "entry point")
    log("Containerfile: the host's driver, the gids 970/971, regend")

    # The chart.
    chart = os.path.join(deploy, "helm", "regen")
    meta = yaml.safe_load(open(os.path.join(chart, "Chart.yaml")))
    version = re.search(r"version\s*:\s*'([^']+)'", open(os.path.join(source, "meson.build")).read()).group(1)
    check(meta["apiVersion"] == "v2" and meta["appVersion"] == version, "Chart.yaml: %s (meson: %s)" % (meta, version))
    values = yaml.safe_load(open(os.path.join(chart, "values.yaml")))
    with_ns = copy.deepcopy(values)
    with_ns["createNamespace"] = True
    rendered = render_chart(chart, with_ns)
    check(rendered == plain, "the chart renders other objects than deploy/kubernetes/regend.yaml:\n%s" %
          yaml.safe_dump_all(rendered, sort_keys=False))
    check([o["kind"] for o in render_chart(chart, values)] == ["DaemonSet"], "createNamespace: false renders a Namespace")
    other = copy.deepcopy(values)
    other.update(runtimeClassName="", nodeSelector={"pool": "gpu"}, tolerations=[])
    other["image"]["tag"] = "9.9.9"
    other["socketPlugin"]["count"] = 7
    other["args"] = other["args"] + ["--log-level", "debug"]
    ds2 = render_chart(chart, other, namespace="gpu-infra")[0]
    spec2 = ds2["spec"]["template"]["spec"]
    c2 = {c["name"]: c for c in spec2["containers"]}
    check(ds2["metadata"]["namespace"] == "gpu-infra" and "runtimeClassName" not in spec2 and
          spec2["nodeSelector"] == {"pool": "gpu"} and "tolerations" not in spec2 and
          c2["regend"]["image"].endswith(":9.9.9") and c2["regend"]["args"][-2:] == ["--log-level", "debug"] and
          json.loads(c2["socket-plugin"]["args"][3])["groups"][0]["count"] == 7,
          "the chart does not substitute its values: %s" % yaml.safe_dump(ds2, sort_keys=False))
    log("chart: renders the plain manifest with its values, and substitutes others")
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
