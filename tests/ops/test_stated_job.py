#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A client states its job (io.regen.SetJob), and metrics carry the job.

- A job stated on the main socket names the caller in a lifecycle reason:
  Status, every Watch event of the change and the log show
  "(stated: NAME)"; regenctl states $REGEN_JOB or --as-job the same way,
  and a job forgotten (SetJob without one) names nothing.
- Hostile job strings (empty, too long, a quote, a backslash, a line feed,
  a space, non-ASCII, a leading '-', not a string) are refused with
  io.regen.InvalidJob {reason} (InvalidParameter for a non-string) on the
  main socket and on a worker socket, and change nothing: the connection
  keeps the job it had. regenctl refuses a bad REGEN_JOB or --as-job as a
  usage error (exit 2) before it does anything.
- Status and `regenctl metrics` give each job's use of each device: its
  connections, imports and their bytes, its calls; connections without a
  job count as source "none". A job's series disappear once its
  connections and imports are gone (an import outlives its connection
  while another connection of its process is open, as ids do).
- A worker tells at most 64 jobs apart, 8 made by one uid: the rest count
  together as "other", so what clients state cannot grow the series
  without bound nor one uid take every entry. A stated job carries the
  uid that stated it (Status and the metrics' `uid` label).

Usage: test_stated_job.py REGEND REGENCTL
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from regend_fixture import Conn, Regend, VarlinkError, call, check, host_buffer, log, operand, regend_path, wait_for
from ctl import dev, generations, parse_metrics, run

N = 16
BAD = [("", "empty"), ("x" * 65, "too long"), ('a"b', "character"), ("a\\b", "character"),
       ("a\nb", "character"), ("a b", "character"), ("caf\u00e9", "character"), ("-lead", "character"),
       ("(none)", "character")]


def jobs_of(d, device):
    return {(j["job"], j["source"]): j for j in call(d.socket, "io.regen.Device.Status")["devices"][device]["jobs"]}


def refused(conn, job, reason):
    try:
        conn.call("io.regen.SetJob", {"job": job})
    except VarlinkError as e:
        check(e.name == "io.regen.InvalidJob" and e.params.get("reason") == reason and "1 to 64" in e.params["message"],
              "SetJob %r: %s %s, wanted InvalidJob %s" % (job, e.name, e.params, reason))
        return
    check(False, "SetJob %r was taken" % job)


def restart_reason(conn, device, reason):
    return conn.call("io.regen.Device.Restart", {"device": device, "reason": reason})["devices"][device]["reason"]


def test_lifecycle_reason(d):
    watch = Conn(d.socket)
    watch.send("io.regen.Device.Watch", more=True)
    for _ in range(d.devices):
        watch.reply()
    m = Conn(d.socket)
    reply = m.call("io.regen.SetJob", {"job": "train-7"})
    check(reply == {"job": "train-7", "source": "client"}, "SetJob's reply: %s" % reply)
    pid = os.getpid()
    want = "restart by pid %d (stated: train-7): step 3" % pid
    check(restart_reason(m, 1, "step 3") == want, "Restart's reply does not name the stated job")
    check(call(d.socket, "io.regen.Device.Status")["devices"][1]["reason"] == want, "Status reason")
    events = [watch.reply() for _ in range(3)]
    check(all(e["reason"] == want for e in events), "Watch events: %s" % events)
    check(want in d.log_text(), "the log does not name the stated job")

    # Hostile strings change nothing: the next reason names the same job.
    for job, reason in BAD:
        refused(m, job, reason)
    try:
        m.call("io.regen.SetJob", {"job": 42})
        check(False, "a job that is no string was taken")
    except VarlinkError as e:
        check(e.name == "org.varlink.service.InvalidParameter" and e.params == {"parameter": "job"},
              "SetJob 42: %s %s" % (e.name, e.params))
    check("(stated: train-7): after" in restart_reason(m, 1, "after"), "a refused job changed the connection's")

    # Forgotten: no job names the caller.
    check(m.call("io.regen.SetJob", {}) == {"job": "", "source": "none"}, "SetJob without a job")
    reason = restart_reason(m, 1, "plain")
    check(reason == "restart by pid %d: plain" % pid, "a forgotten job still names the caller: %r" % reason)
    m.close()
    watch.close()
    log("a stated job names the caller in Status, Watch and the log; %d hostile strings refused, nothing changed"
        % (len(BAD) + 1))


def test_regenctl(regenctl, d):
    rc, out, err = run(regenctl, d, "--as-job", "epilog-9", "restart", "--device", "1", "--reason", "end")
    reason = call(d.socket, "io.regen.Device.Status")["devices"][1]["reason"]
    check(rc == 0 and "(stated: epilog-9): end" in reason, "--as-job: exit %d, reason %r" % (rc, reason))
    rc, out, err = run(regenctl, d, "restart", "--device", "1", "--reason", "begin", env={"REGEN_JOB": "slurm:77"})
    reason = call(d.socket, "io.regen.Device.Status")["devices"][1]["reason"]
    check(rc == 0 and "(stated: slurm:77): begin" in reason, "REGEN_JOB: exit %d, reason %r" % (rc, reason))
    before = generations(d)
    for args, env, what in ((["--as-job", 'x"y'], None, "--as-job"), ([], {"REGEN_JOB": "two\nlines"}, "REGEN_JOB"),
                            ([], {"REGEN_JOB": "y" * 65}, "REGEN_JOB")):
        rc, out, err = run(regenctl, d, *(args + ["restart", "--device", "1"]), env=env)
        check(rc == 2 and what in err and "1 to 64" in err, "%s refused: exit %d %s" % (what, rc, err))
    check(generations(d) == before, "a refused job restarted a device")
    log("regenctl states --as-job and REGEN_JOB, and refuses bad ones before it acts")


def test_metrics(regenctl, d):
    size = 2 * N * N * 4
    fd, mm = host_buffer(size)
    w = Conn(d.worker_socket(0))
    check(w.call("io.regen.SetJob", {"job": "eval-1"}) == {"job": "eval-1", "source": "client"}, "SetJob on a worker")
    for job, reason in BAD:
        refused(w, job, reason)
    buf = w.call("io.regen.Memory.ImportBuffer", {"device": 0, "kind": "host_fd", "size": size, "fd": 0},
                 fds=[fd])["buffer"]
    for _ in range(3):
        w.call("io.regen.Compute.Gemm", {"a": operand(buf, 0, (N, N)), "b": operand(buf, 0, (N, N)),
                                         "d": operand(buf, N * N * 4, (N, N))})
    # A connection of the same process without a job.
    plain = Conn(d.worker_socket(0))
    plain.call("io.regen.Device.Generation")
    jobs = jobs_of(d, 0)
    check(set(jobs) == {("eval-1", "client"), ("", "none")}, "Status jobs of device 0: %s" % jobs)
    j = jobs[("eval-1", "client")]
    check((j["sessions"], j["buffers"], j["buffer_bytes"], j["calls"], j["call_errors"], j["in_flight"]) ==
          (1, 1, size, 3, 0, 0), "eval-1 on device 0: %s" % j)
    check(jobs[("", "none")]["sessions"] == 1 and jobs[("", "none")]["buffers"] == 0, "none: %s" % jobs)
    check(jobs_of(d, 1) == {}, "device 1 lists jobs: %s" % jobs_of(d, 1))

    rc, out, err = run(regenctl, d, "metrics")
    check(rc == 0, "metrics: exit %d" % rc)
    s, types = parse_metrics(out)
    lab = {"client_job": "eval-1", "job_source": "client"}
    check(dev(s, "regen_job_sessions", 0, **lab) == 1 and dev(s, "regen_job_buffers", 0, **lab) == 1 and
          dev(s, "regen_job_buffer_bytes", 0, **lab) == size and dev(s, "regen_job_calls_total", 0, **lab) == 3 and
          dev(s, "regen_job_call_errors_total", 0, **lab) == 0 and dev(s, "regen_job_events", 0, **lab) == 0,
          "eval-1's series: %s" % out)
    check(dev(s, "regen_job_sessions", 0, client_job="", job_source="none") == 1, "the jobless connection's series")

    # The job's connection closes (the worker hears of it in its own time);
    # its import lives on (its process has another connection), so the job
    # stays listed, without a session.
    w.close()
    wait_for(lambda: jobs_of(d, 0).get(("eval-1", "client"), {}).get("sessions") == 0, 10,
             "eval-1 without a session")
    j = jobs_of(d, 0).get(("eval-1", "client"))
    check(j["buffers"] == 1 and j["buffer_bytes"] == size, "eval-1 after its connection closed: %s" % j)
    plain.call("io.regen.Memory.CloseBuffer", {"buffer": buf})
    check(("eval-1", "client") not in jobs_of(d, 0), "eval-1 listed with nothing left: %s" % jobs_of(d, 0))
    plain.close()
    os.close(fd)
    wait_for(lambda: jobs_of(d, 0) == {}, 10, "no job on device 0 with no client")
    rc, out, err = run(regenctl, d, "metrics")
    s, types = parse_metrics(out)
    check(not any(n.startswith("regen_job_") for n, _ in s), "job series with no client left: %s" % out)
    log("Status and metrics give each job's connections, imports and calls; they go with the job")


def test_bounded(regenctl, d):
    # One uid makes at most 8 entries of its own (the worker's 64 are for
    # every uid: the unit test holds that bound); its 9th and 10th jobs
    # count as "other".
    conns = []
    for i in range(10):
        c = Conn(d.worker_socket(1))
        c.call("io.regen.SetJob", {"job": "j-%d" % i})
        conns.append(c)
    jobs = jobs_of(d, 1)
    named = [k for k in jobs if k[1] == "client"]
    check(len(named) == 8 and jobs.get(("", "other"), {}).get("sessions") == 2, "10 jobs of one uid on device 1: %s" %
          sorted(jobs))
    check(all(jobs[k]["uid"] == os.getuid() for k in named), "a stated job's uid: %s" % jobs)
    s, _ = parse_metrics(run(regenctl, d, "metrics")[1])
    labels = {dict(l)["client_job"] for n, l in s if n == "regen_job_sessions" and ("device", "1") in l}
    check(len(labels) == 9, "device 1 has %d job labels" % len(labels))
    check(dev(s, "regen_job_sessions", 1, client_job="j-0", job_source="client", uid=os.getuid()) == 1,
          "the stated job's series has its uid")
    # A connection that states a job listed already joins it, even past the limit.
    conns[-1].call("io.regen.SetJob", {"job": "j-0"})
    check(jobs_of(d, 1)[("j-0", "client")]["sessions"] == 2 and jobs_of(d, 1)[("", "other")]["sessions"] == 1,
          "moving to a listed job")
    for c in conns:
        c.close()
    wait_for(lambda: jobs_of(d, 1) == {}, 10, "no job left on device 1")
    log("10 jobs of one uid on one device: 8 listed with its uid, the rest as other; none left once they closed")


def main():
    regend = regend_path()
    regenctl = os.path.abspath(sys.argv[2])
    with Regend(regend, devices=2) as d:
        test_lifecycle_reason(d)
        test_regenctl(regenctl, d)
        test_metrics(regenctl, d)
        test_bounded(regenctl, d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
