#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""regen-nvrx-health answers NVRx's node health check as NVRx asks it.

The client side is NVRx's own path, written here from its sources
(NVIDIA/nvidia-resiliency-ext, commit d8686d9:
shared_utils/proto/nvhcd.proto and shared_utils/health_check.py's
NodeHealthCheck): a grpc.insecure_channel on unix://PATH, the unary call
/nvhcd.HealthCheckService/RunHealthCheck with NVRx's default args, its
messages built by Google's protobuf from a descriptor of nvhcd.proto (not
by regen's encoder), and NVRx's verdict: healthy where success is true and
the output's JSON has fail_count 0.

1. regen.nvrx's encoder and decoder against protobuf's, both ways
   (negative exit codes, text beyond ASCII, unknown fields skipped).
2. A host-backend regend of two devices, the service started on its own
   Unix socket: healthy; asked while a restart drains a hung call (the
   answer waits for the restart's end: healthy); device 1's GPU failed (XID 79): not
   healthy, the failed check naming device 1 and the XID; regend gone:
   not healthy, exit code 5, the error saying regend does not answer; the
   socket's mode as asked.

Skipped (77) where /usr/bin/python3 (or python3) has no grpcio or
protobuf (Debian: python3-grpcio, python3-protobuf).

Usage: test_nvrx.py REGEND REGENCTL SOURCE_DIR
"""
import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from regend_fixture import TIME_SCALE, Regend, call, check, log, skip, wait_for

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))
import regen  # noqa: E402
from regen.host import HostTensor  # noqa: E402

# What runs under the Python with grpcio: argv[1] the service's socket,
# argv[2] what to print (one JSON line per call, NVRx's view of it).
CLIENT = r'''
import json, sys
import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
try:
    from google.protobuf.message_factory import GetMessageClass
except ImportError:   # protobuf < 4.21
    from google.protobuf import message_factory
    GetMessageClass = lambda d: message_factory.MessageFactory().GetPrototype(d)

# nvhcd.proto, as NVRx declares it.
f = descriptor_pb2.FileDescriptorProto(name="nvhcd.proto", package="nvhcd", syntax="proto3")
req = f.message_type.add(name="HealthCheckRequest")
req.field.add(name="args", number=1, type=9, label=3)
resp = f.message_type.add(name="HealthCheckResponse")
for name, number, kind in (("success", 1, 8), ("exit_code", 2, 5), ("output", 3, 9), ("error", 4, 9)):
    resp.field.add(name=name, number=number, type=kind, label=1)
pool = descriptor_pool.DescriptorPool()
pool.Add(f)
Request = GetMessageClass(pool.FindMessageTypeByName("nvhcd.HealthCheckRequest"))
Response = GetMessageClass(pool.FindMessageTypeByName("nvhcd.HealthCheckResponse"))

if sys.argv[1] == "codec":
    sys.path.insert(0, sys.argv[2])
    from regen import nvrx
    for args in ([], ["--no-slurm", "--group", "gpu"], ["ünïcode ✓", ""]):
        wire = Request(args=args).SerializeToString()
        assert nvrx.decode_request(wire) == args, (args, nvrx.decode_request(wire))
        assert Request.FromString(nvrx.encode_request(args)).args == args
    for fields in ((True, 0, '{"fail_count": 0}', ""), (False, 7, "", "é"), (False, -3, "x" * 300, "e")):
        m = Response.FromString(nvrx.encode_response(*fields))
        assert (m.success, m.exit_code, m.output, m.error) == fields, (fields, m)
        ours = nvrx.decode_response(Response(success=fields[0], exit_code=fields[1], output=fields[2],
                                             error=fields[3]).SerializeToString())
        assert ours == dict(zip(("success", "exit_code", "output", "error"), fields)), ours
    # A field this service does not know (a later NVRx's) is skipped.
    extra = Request(args=["a"]).SerializeToString() + bytes([0x10, 0x05, 0x1a, 0x01, 0x7a])
    assert nvrx.decode_request(extra) == ["a"]
    print("codec ok")
    sys.exit(0)

# NodeHealthCheck._perform_health_check, as NVRx writes it.
with grpc.insecure_channel("unix://" + sys.argv[1]) as channel:
    run = channel.unary_unary("/nvhcd.HealthCheckService/RunHealthCheck",
                              request_serializer=Request.SerializeToString, response_deserializer=Response.FromString)
    r = run(Request(args=["--no-slurm", "--group", "prolog", "epilog", "logs", "gpu"]), timeout=60)
healthy = r.success
try:
    out = json.loads(r.output)
    healthy = healthy and out.get("fail_count") == 0
except ValueError:
    out, healthy = None, False
print(json.dumps({"healthy": healthy, "success": r.success, "exit_code": r.exit_code, "output": out,
                  "error": r.error}))
'''


def grpc_python():
    for py in ("/usr/bin/python3", sys.executable):
        if os.access(py, os.X_OK) and subprocess.run([py, "-c", "import grpc, google.protobuf"],
                                                     capture_output=True).returncode == 0:
            return py
    return None


def ask(py, script, sock):
    r = subprocess.run([py, script, sock], capture_output=True, text=True, timeout=120 * TIME_SCALE)
    check(r.returncode == 0, "the NVRx-style call failed: %s%s" % (r.stdout[-2000:], r.stderr[-3000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    regend, regenctl, source = (os.path.abspath(a) for a in sys.argv[1:4])
    py = grpc_python()
    if py is None:
        skip("no Python here has grpcio and protobuf (Debian: python3-grpcio, python3-protobuf)")
    with tempfile.TemporaryDirectory(prefix="regen-nvrx-") as tmp:
        return check_the_service(regend, regenctl, source, py, tmp)


def check_the_service(regend, regenctl, source, py, tmp):
    package = os.path.join(source, "client", "python")
    script = os.path.join(tmp, "nvrx_client.py")
    with open(script, "w") as f:
        f.write(CLIENT)
    r = subprocess.run([py, script, "codec", package], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, "regen.nvrx's messages against protobuf's: %s%s" % (r.stdout, r.stderr[-3000:]))
    log("regen.nvrx's encoder and decoder agree with protobuf's both ways")

    sock = os.path.join(tmp, "nvhcd", "nvhcd.sock")
    # failed_retry_ms: a failed GPU stays failed for the test's length.
    with Regend(regend, devices=2, config="failed_retry_ms = 600000\n") as d:
        env = dict(os.environ, PYTHONPATH=package)
        service = subprocess.Popen([py, "-m", "regen.nvrx", "--socket", sock, "--regend-socket", d.socket,
                                    "--regenctl", regenctl, "--settle-ms", str(int(8000 * TIME_SCALE)),
                                    "--socket-mode", "0600"],
                                   env=env, stderr=open(os.path.join(tmp, "service.log"), "w"))
        try:
            service_log = os.path.join(tmp, "service.log")
            wait_for(lambda: "answering" in open(service_log).read() or service.poll() is not None,
                     30 * TIME_SCALE, "the service listening")
            check(service.poll() is None, "the service exited: %s" % open(service_log).read())
            check(stat.S_IMODE(os.stat(sock).st_mode) == 0o600, "the socket's mode is not the 0600 asked for")

            got = ask(py, script, sock)
            check(got["healthy"] and got["exit_code"] == 0 and got["output"]["fail_count"] == 0 and
                  [x["health"] for x in got["output"]["devices"]] == ["ok", "ok"], "healthy node: %r" % got)
            log("healthy: success, fail_count 0, both devices ok")

            # A restart that drains a hung call for 3 s: asked in the middle,
            # the answer waits for its end.
            client = regen.Client(d.socket)
            tensors = [HostTensor([64, 64]) for _ in range(3)]
            for t in tensors:
                t.import_into(client, 0)
            call(d.socket, "io.regen.Device.InjectFault", {"device": 0, "kind": "hang"})
            client.gemm(tensors[0].op, tensors[1].op, tensors[2].op, wait=False)
            restart = threading.Thread(target=call, args=(d.socket, "io.regen.Device.Restart",
                                                          {"device": 0, "deadline_ms": 3000}, 30 * TIME_SCALE))
            restart.start()
            wait_for(lambda: call(d.socket, "io.regen.Device.Generation")["devices"][0]["state"] == "draining",
                     10 * TIME_SCALE, "device 0 draining")
            got = ask(py, script, sock)
            restart.join()
            client.close()
            check(got["healthy"] and got["output"]["waited_ms"] >= 1000,
                  "asked while device 0 drained for a restart: %r" % got)
            log("asked during a restart's drain: healthy once the device serves again (waited %d ms)" %
                got["output"]["waited_ms"])

            call(d.socket, "io.regen.Device.InjectFault", {"device": 1, "kind": "xid", "xid": 79})
            wait_for(lambda: call(d.socket, "io.regen.Device.Generation")["devices"][1]["state"] == "failed",
                     30 * TIME_SCALE, "device 1 failed")
            got = ask(py, script, sock)
            failed = got["output"]["failed_checks"] if got["output"] else []
            check(not got["healthy"] and not got["success"] and got["exit_code"] == 8 and
                  got["output"]["fail_count"] == 1 and len(failed) == 1 and failed[0].startswith("device 1: failed")
                  and "XID 79" in failed[0], "a failed GPU: %r" % got)
            log("XID 79 on device 1: unhealthy, %r" % failed[0])
            d.stop()
            started = time.monotonic()
            got = ask(py, script, sock)
            check(not got["healthy"] and got["exit_code"] == 5 and "regend does not answer" in got["error"],
                  "regend gone: %r" % got)
            log("regend gone: unhealthy, exit code 5, %r (after %.1f s of waiting for it)" %
                (got["error"], time.monotonic() - started))
        finally:
            service.terminate()
            try:
                service.wait(timeout=10)
            except subprocess.TimeoutExpired:
                service.kill()
        check(service.returncode == 0, "the service ended with %r on SIGTERM" % service.returncode)
        check(not os.path.exists(sock), "the service left its socket behind")
    return 0


if __name__ == "__main__":
    sys.exit(main())
