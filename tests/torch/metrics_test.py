"""What a tessera process group shows the outside: Prometheus /metrics per rank
(TESSERA_METRICS_PORT), promtool-clean, over HTTPS with basic auth when asked
(TESSERA_METRICS_TLS_CERT/_KEY, TESSERA_METRICS_AUTH_FILE), and registration with a running
tessera-coordinator (TESSERA_COORDINATOR), whose service discovery then lists every torch rank."""

import base64
import json
import os
import re
import subprocess
import sys
import tempfile
import ssl
import time
import unittest
import urllib.error
import urllib.request

import torch
import torch.distributed as dist

import torch_testing

_RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE",
                                                                             "tessera"))


def _fetch(url):
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


def _ops_then_metrics(rank, world_size):
    import tessera.torch

    t = torch.zeros(1024)  # 4 KiB
    for _ in range(3):
        dist.all_reduce(t)
    dist.broadcast(torch.zeros(10, dtype=torch.int64), src=0)
    dist.barrier()
    return tessera.torch.metrics_url(), _fetch(tessera.torch.metrics_url())


_TESTDATA = os.path.join(_RUNFILES, "common/metrics/testdata")


def _fetch_https(url, authorization=None):
    """(status, body) of a GET of `url`, verified against the test certificate."""
    context = ssl.create_default_context(cafile=os.path.join(_TESTDATA, "test_cert.pem"))
    request = urllib.request.Request(url)
    if authorization:
        request.add_header("Authorization", "Basic " +
                           base64.b64encode(authorization.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""


def _https_metrics(rank, world_size):
    import tessera.torch

    dist.all_reduce(torch.zeros(16))
    url = tessera.torch.metrics_url()
    results = (url, _fetch_https(url), _fetch_https(url, "prometheus:wrong"),
               _fetch_https(url, "prometheus:s3cret"))
    dist.barrier()  # neither rank stops serving before the other has read its page
    return results


def _sample(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def _assert_promtool_clean(test, text):
    with tempfile.NamedTemporaryFile("w", suffix=".prom") as f:
        f.write(text)
        f.flush()
        with open(f.name) as stdin:
            check = subprocess.run(["promtool", "check", "metrics"], stdin=stdin,
                                   capture_output=True, text=True, timeout=60)
    test.assertEqual(check.returncode, 0, check.stdout + check.stderr)


def _fsdp_over_gloo(rank, world_size):
    """FSDP's instruments in a process whose only group is Gloo's."""
    from tessera.torch import _C

    _C.fsdp_add_param_bytes("shard", 1000)
    _C.fsdp_add_param_bytes("gathered", 4000)
    _C.fsdp_add_param_bytes("gathered", 6000)
    _C.fsdp_add_param_bytes("gathered", -4000)
    _C.fsdp_observe_collective("all_gather", 0.25, 4000)
    _C.fsdp_observe_collective("all_gather", 0.5, 6000)
    _C.fsdp_prefetch_wait(0.125)
    errors = []
    for call in (lambda: _C.fsdp_add_param_bytes("params", 1),
                 lambda: _C.fsdp_observe_collective("allgather", 0.1, 1),
                 lambda: _C.fsdp_observe_collective("all_gather", 0.1, -1),
                 lambda: _C.fsdp_prefetch_wait(float("nan"))):
        try:
            call()
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    before = _C.fsdp_metrics()
    _C.fsdp_reset_peaks()
    return before, _C.fsdp_metrics(), errors, _C.metrics_url()


def _fsdp_then_a_tessera_group(rank, world_size):
    """FSDP's first call comes before the tessera group: the group's /metrics serves it."""
    import tessera.torch
    from tessera.torch import _C

    _C.fsdp_add_param_bytes("shard", 100 * (rank + 1))
    dist.init_process_group("tessera", rank=rank, world_size=world_size,
                            init_method=f"file://{os.environ['TESSERA_TEST_DIR']}/store")
    _C.fsdp_add_param_bytes("full_gradient", 4096)
    _C.fsdp_observe_collective("reduce_scatter", 0.01, 4096)
    _C.fsdp_add_param_bytes("full_gradient", -4096)
    _C.fsdp_observe_collective("all_reduce", 0.02, 2048)
    _C.fsdp_prefetch_wait(0.5)
    dist.all_reduce(torch.zeros(4))
    text = _fetch(tessera.torch.metrics_url())
    dist.barrier()  # neither rank stops serving before the other has read its page
    dist.destroy_process_group()
    return text


class FsdpMetricsTest(unittest.TestCase):
    def test_the_instruments_work_without_a_tessera_group(self):
        [(before, after, errors, url)] = torch_testing.run_ranks(_fsdp_over_gloo, 1,
                                                                 backend="gloo")
        self.assertEqual(url, "")
        self.assertEqual(before["held"], {"shard": 1000, "gathered": 6000, "gradient_shard": 0,
                                          "full_gradient": 0})
        self.assertEqual(before["peak"], {"shard": 1000, "gathered": 10000,
                                          "gradient_shard": 0, "full_gradient": 0})
        self.assertEqual(before["collective_count"],
                         {"all_gather": 2, "reduce_scatter": 0, "all_reduce": 0})
        self.assertAlmostEqual(before["collective_seconds"]["all_gather"], 0.75)
        self.assertEqual(before["prefetch_waits"], 1)
        self.assertAlmostEqual(before["prefetch_wait_seconds"], 0.125)
        self.assertEqual(after["peak"]["gathered"], 6000)  # reset to what is held
        self.assertEqual(after["held"], before["held"])
        self.assertIn("'params' is not one of shard, gathered, gradient_shard or "
                      "full_gradient", errors[0])
        self.assertIn("'allgather' is not one of all_gather, reduce_scatter or all_reduce",
                      errors[1])
        self.assertIn("nbytes must be >= 0", errors[2])
        self.assertIn("seconds must be finite", errors[3])

    def test_the_backends_page_serves_them_promtool_clean(self):
        results = torch_testing.run_ranks(_fsdp_then_a_tessera_group, 2, init=False,
                                          env={"TESSERA_METRICS_PORT": "0"})
        for rank, text in enumerate(results):
            with self.subTest(rank=rank):
                self.assertEqual(_sample(text, 'tessera_fsdp_param_bytes{kind="shard"}'),
                                 100 * (rank + 1), text)
                self.assertEqual(_sample(text, 'tessera_fsdp_param_bytes{kind="full_gradient"}'),
                                 0)
                self.assertEqual(
                    _sample(text, 'tessera_fsdp_param_peak_bytes{kind="full_gradient"}'), 4096)
                self.assertEqual(_sample(text, 'tessera_fsdp_collective_seconds_count'
                                               '{op="reduce_scatter"}'), 1)
                self.assertEqual(_sample(text, 'tessera_fsdp_collective_bytes_total'
                                               '{op="all_reduce"}'), 2048)
                self.assertEqual(_sample(text, 'tessera_fsdp_prefetch_waits_total'), 1)
                self.assertEqual(_sample(text, 'tessera_fsdp_prefetch_wait_seconds_total'), 0.5)
                # The backend's own series share the page.
                self.assertEqual(_sample(text, 'tessera_collective_bytes_total{op="allreduce"}'),
                                 16)
                _assert_promtool_clean(self, text)


class MetricsTest(unittest.TestCase):
    def test_each_rank_serves_its_ops_promtool_clean(self):
        results = torch_testing.run_ranks(_ops_then_metrics, 2,
                                          env={"TESSERA_METRICS_PORT": "0"})
        urls = [url for url, _ in results]
        self.assertEqual(len(set(urls)), 2, urls)
        for rank, (url, text) in enumerate(results):
            with self.subTest(rank=rank):
                self.assertTrue(url.startswith("http://127.0.0.1:"), url)
                self.assertEqual(_sample(text, 'tessera_collective_seconds_count{op="allreduce",'
                                               'size_class="<64KiB"}'), 3, text)
                self.assertEqual(_sample(text, 'tessera_collective_bytes_total{op="allreduce"}'),
                                 3 * 4096)
                self.assertEqual(_sample(text, 'tessera_collective_bytes_total{op="broadcast"}'),
                                 80)
                self.assertEqual(_sample(text, 'tessera_collective_errors_total{op="allreduce"}'),
                                 0)
                self.assertEqual(_sample(text, 'tessera_collective_seconds_count{op="barrier",'
                                               'size_class="<64KiB"}'), 1)
                # FSDP's series appear with FSDP's first call, not with the group.
                self.assertNotIn("tessera_fsdp_", text)
                _assert_promtool_clean(self, text)


class MetricsSecurityTest(unittest.TestCase):
    def test_each_rank_serves_https_with_basic_auth(self):
        with tempfile.TemporaryDirectory() as directory:
            users = os.path.join(directory, "users")
            with open(os.open(users, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write("prometheus:s3cret\n")
            results = torch_testing.run_ranks(_https_metrics, 2, env={
                "TESSERA_METRICS_PORT": "0",
                "TESSERA_METRICS_TLS_CERT": os.path.join(_TESTDATA, "test_cert.pem"),
                "TESSERA_METRICS_TLS_KEY": os.path.join(_TESTDATA, "test_key.pem"),
                "TESSERA_METRICS_AUTH_FILE": users})
        for rank, (url, anonymous, wrong, right) in enumerate(results):
            with self.subTest(rank=rank):
                self.assertTrue(url.startswith("https://127.0.0.1:"), url)
                self.assertEqual(anonymous[0], 401)
                self.assertEqual(wrong[0], 401)
                self.assertEqual(right[0], 200)
                self.assertIn('tessera_collective_bytes_total{op="allreduce"} 64', right[1])

    def test_a_readable_auth_file_stops_the_group_naming_the_variable(self):
        with tempfile.TemporaryDirectory() as directory:
            users = os.path.join(directory, "users")
            with open(users, "w") as f:
                f.write("prometheus:s3cret\n")
            os.chmod(users, 0o644)
            failure = torch_testing.run_ranks(_ops_then_metrics, 1, return_errors=True, env={
                "TESSERA_METRICS_PORT": "0", "TESSERA_METRICS_AUTH_FILE": users})
        self.assertIsInstance(failure, torch_testing.RankFailure)
        self.assertIn("TESSERA_METRICS_AUTH_FILE", failure.errors[0])
        self.assertIn("chmod 600", failure.errors[0])


def _registered(rank, world_size):
    import tessera.torch

    dist.barrier()  # every rank has registered before the group existed
    sd = _fetch(os.environ["TEST_COORDINATOR_SD"]) if rank == 0 else None
    dist.barrier()
    return tessera.torch.metrics_url(), sd


def _start_coordinator(stderr):
    """A tessera-coordinator for torch ranks; its TESSERA_READY fields."""
    binary = os.path.join(_RUNFILES, "coordinator/tessera-coordinator")
    coordinator = subprocess.Popen(
        [binary, "--num-workers", "0", "--coordinator", "127.0.0.1:0", "--job", "torchjob"],
        stdout=subprocess.PIPE, stderr=stderr, text=True)
    ready = {}
    deadline = time.monotonic() + 30
    while not ready and time.monotonic() < deadline:
        line = coordinator.stdout.readline()
        if not line:
            break
        if line.startswith("TESSERA_READY "):
            ready = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
    return coordinator, ready


# Rank 1 fails with an uncaught exception once the group is up; rank 0 waits in a barrier.
_FAILING_SCRIPT = """
import sys
import torch.distributed as dist
import tessera.torch
rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("tessera", init_method="file://" + store, rank=rank, world_size=2)
if rank == 1:
    raise RuntimeError("injected failure after joining")
dist.barrier()
"""


def _fsdp_on_the_dashboard(rank, world_size):
    """FSDP's series of a registered rank; rank 0 waits until the dashboard has both ranks'."""
    from tessera.torch import _C

    # 256 KiB, 512 KiB, 128 KiB: six significant digits, which the dashboard's JSON keeps.
    _C.fsdp_add_param_bytes("shard", (rank + 1) * 262144)
    _C.fsdp_add_param_bytes("gathered", 131072)
    _C.fsdp_add_param_bytes("gathered", -131072)
    _C.fsdp_observe_collective("all_gather", 0.02, 131072)
    _C.fsdp_observe_collective("reduce_scatter", 0.03, 131072)
    _C.fsdp_prefetch_wait(0.004)
    data = None
    if rank == 0:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            data = json.loads(_fetch(os.environ["TEST_COORDINATOR_DATA"]))
            fsdp = [p for p in data["processes"] if p["role"] == "worker" and p["fsdp"]]
            if len(fsdp) == world_size:
                break
            time.sleep(0.2)
    dist.barrier()  # both ranks stay (and are scraped) until rank 0 has seen them
    return data


def _pipeline_on_the_dashboard(rank, world_size):
    """Two 1F1B steps of a 2-stage pipeline with 4 micro-batches on a registered rank; rank 0
    waits until the dashboard has both ranks' last steps. Returns (the dashboard's data, this
    rank's schedule's timeline and its expected bound)."""
    from tessera.torch import pipelining

    torch.manual_seed(0)
    stage = pipelining.PipelineStage(torch.nn.Linear(8, 8), rank, world_size, "cpu")
    schedule = pipelining.Schedule1F1B(stage, 4, loss_fn=torch.nn.MSELoss())
    x, y = torch.randn(16, 8), torch.randn(16, 8)
    for _ in range(2):
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
    data = None
    if rank == 0:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            data = json.loads(_fetch(os.environ["TEST_COORDINATOR_DATA"]))
            ranks = [p for p in data["processes"] if p["role"] == "worker" and p["pipeline"]
                     and p["pipeline"]["steps"] == 2]
            if len(ranks) == world_size:
                break
            time.sleep(0.2)
    dist.barrier()  # both ranks stay (and are scraped) until rank 0 has seen them
    timeline = [(op, s, m) for op, s, m, _, _ in schedule.timeline]
    return data, timeline, schedule.expected_peak_held, schedule.peak_held


def _chromium_dom(url):
    """The DOM of `url` after its JavaScript ran, from a headless Chromium (Debian's chromium,
    tools/install_deps.sh), bounded by 90 s; the whole process group is killed on a timeout."""
    with tempfile.TemporaryDirectory() as profile:
        browser = subprocess.Popen(
            ["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--user-data-dir=" + profile,
             "--virtual-time-budget=5000", "--dump-dom", url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = browser.communicate(timeout=90)
        finally:
            if browser.poll() is None:
                os.killpg(browser.pid, 9)
                browser.communicate()
    return browser.returncode, out, err


class CoordinatorTest(unittest.TestCase):
    def test_chromium_shows_the_fsdp_panel_of_the_torch_ranks(self):
        self.assertTrue(os.access("/usr/bin/chromium", os.X_OK),
                        "/usr/bin/chromium is missing: run tools/install_deps.sh")
        coordinator, ready = _start_coordinator(subprocess.DEVNULL)
        try:
            self.assertTrue(ready, "the coordinator never printed TESSERA_READY")
            dashboard = ready["metrics"].replace("/metrics", "/dashboard")
            results = torch_testing.run_ranks(
                _fsdp_on_the_dashboard, 2,
                env={"TESSERA_COORDINATOR": ready["address"][len("tcp://"):],
                     "TEST_COORDINATOR_DATA": dashboard + "/data"})
            workers = {p["rank"]: p for p in results[0]["processes"] if p["role"] == "worker"}
            for rank in range(2):
                fsdp = workers[rank]["fsdp"]
                self.assertIsNotNone(fsdp, workers[rank])
                self.assertEqual(fsdp["held"]["shard"], (rank + 1) * 262144)
                self.assertEqual(fsdp["peak"]["gathered"], 131072)
                self.assertEqual(fsdp["collectives"]["reduce_scatter"]["count"], 1)
                self.assertEqual(fsdp["prefetch_waits"], 1)
            code, dom, err = _chromium_dom(dashboard)
            self.assertEqual(code, 0, err)
            self.assertIn('id="fsdp-panel"', dom)
            self.assertNotIn('id="fsdp-panel" hidden', dom, dom[:4000])
            rows = re.findall(r'<tr data-fsdp="([^"]*)">(.*?)</tr>', dom)
            self.assertEqual([name for name, _ in rows], ["worker 0", "worker 1"], dom[:4000])
            for rank, (_, row) in enumerate(rows):
                self.assertIn(f'data-kind="shard">{256 * (rank + 1)} KiB (', row)
                self.assertIn('data-kind="gathered">0 B (128 KiB)', row)
                self.assertIn('data-op="all_gather"', row)
                self.assertIn("20.0 ms \u00d7 1", row)
                self.assertIn('data-prefetch-waits="1"', row)
        finally:
            coordinator.terminate()
            coordinator.wait(timeout=30)
            coordinator.stdout.close()


    def test_chromium_draws_the_pipeline_timeline_of_the_torch_ranks(self):
        self.assertTrue(os.access("/usr/bin/chromium", os.X_OK),
                        "/usr/bin/chromium is missing: run tools/install_deps.sh")
        coordinator, ready = _start_coordinator(subprocess.DEVNULL)
        try:
            self.assertTrue(ready, "the coordinator never printed TESSERA_READY")
            dashboard = ready["metrics"].replace("/metrics", "/dashboard")
            results = torch_testing.run_ranks(
                _pipeline_on_the_dashboard, 2,
                env={"TESSERA_COORDINATOR": ready["address"][len("tcp://"):],
                     "TEST_COORDINATOR_DATA": dashboard + "/data"})
            data = results[0][0]
            workers = {p["rank"]: p for p in data["processes"] if p["role"] == "worker"}
            for rank in range(2):
                pipeline = workers[rank]["pipeline"]
                self.assertIsNotNone(pipeline, workers[rank])
                _, timeline, bound, held = results[rank]
                self.assertEqual(pipeline["rank"], rank)
                self.assertEqual(pipeline["steps"], 2)
                self.assertEqual(pipeline["held_bound"], bound)
                self.assertEqual(pipeline["held"], held)
                # 1F1B with 2 ranks and 4 micro-batches: (P-1)/(M+P-1).
                self.assertAlmostEqual(pipeline["bubble_formula"], 0.2, places=5)
                # The dashboard's actions are the schedule's last step's, in its order.
                self.assertEqual([tuple(a[:3]) for a in pipeline["actions"]], timeline)
                for _, _, _, start, end in pipeline["actions"]:
                    self.assertLessEqual(0, start)
                    self.assertLessEqual(start, end)
                    self.assertLessEqual(end, pipeline["step_seconds"] * 1.001)
                self.assertGreater(0.999, pipeline["bubble_last_step"])
                # 2 steps x 4 micro-batches x a 4 x 8 float32 tensor, one way each.
                sent = pipeline["sent_bytes_total"]
                self.assertEqual(sent["activation" if rank == 0 else "gradient"], 2 * 4 * 128)
                self.assertEqual(sent["gradient" if rank == 0 else "activation"], 0)
            code, dom, err = _chromium_dom(dashboard)
            self.assertEqual(code, 0, err)
            self.assertNotIn('id="pipeline-panel" hidden', dom, dom[:4000])
            rows = re.findall(
                r'<g data-pipeline-row="([^"]*)" data-pipeline-rank="(\d+)">(.*?)</g>', dom)
            self.assertEqual([(name, rank) for name, rank, _ in rows],
                             [("worker 0", "0"), ("worker 1", "1")], dom[:4000])
            for rank, (_, _, row) in enumerate(rows):
                drawn = re.findall(r'data-action="(\d+)([FBIW])(\d+)"', row)
                self.assertEqual(sorted(drawn),
                                 sorted((str(rank), op, str(m)) for op in "FB" for m in range(4)))
            table = re.findall(r'<tr data-pipeline="([^"]*)">', dom)
            self.assertEqual(table, ["worker 0", "worker 1"], dom[:4000])
            self.assertIn('data-bubble-formula="0.2">20.0 %', dom)
        finally:
            coordinator.terminate()
            coordinator.wait(timeout=30)
            coordinator.stdout.close()

    def test_an_uncaught_exception_is_told_to_the_coordinator(self):
        with tempfile.TemporaryDirectory() as directory:
            log_path = os.path.join(directory, "coordinator.log")
            with open(log_path, "w") as log:
                coordinator, ready = _start_coordinator(log)
            try:
                self.assertTrue(ready, "the coordinator never printed TESSERA_READY")
                script = os.path.join(directory, "train.py")
                with open(script, "w") as f:
                    f.write(_FAILING_SCRIPT)
                env = dict(os.environ, TESSERA_COORDINATOR=ready["address"][len("tcp://"):])
                ranks = [subprocess.Popen(
                    [sys.executable, script, str(rank), os.path.join(directory, "store")],
                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                    for rank in range(2)]
                outputs = [p.communicate(timeout=90)[0] for p in ranks]
                self.assertIn("RuntimeError: injected failure after joining", outputs[1])
                self.assertNotEqual(ranks[0].returncode, 0, outputs[0])
                # The coordinator heard the cause from rank 1 itself (not "no heartbeat").
                deadline = time.monotonic() + 10
                text = ""
                while time.monotonic() < deadline:
                    with open(log_path) as log:
                        text = log.read()
                    if "RuntimeError" in text:
                        break
                    time.sleep(0.1)
                self.assertIn("it stopped with UNKNOWN: RuntimeError: injected failure after "
                              "joining", text)
                self.assertNotIn("no heartbeat", text)
            finally:
                coordinator.terminate()
                coordinator.wait(timeout=30)
                coordinator.stdout.close()

    def test_the_coordinators_service_discovery_lists_every_rank(self):
        coordinator, ready = _start_coordinator(subprocess.DEVNULL)
        try:
            self.assertTrue(ready, "the coordinator never printed TESSERA_READY")
            address = ready["address"][len("tcp://"):]
            sd_url = ready["metrics"].replace("/metrics", "/sd")
            results = torch_testing.run_ranks(
                _registered, 2,
                env={"TESSERA_COORDINATOR": address, "TEST_COORDINATOR_SD": sd_url})
            groups = json.loads(results[0][1])
            workers = {g["labels"]["rank"]: g["targets"][0] for g in groups
                       if g["labels"]["role"] == "worker"}
            for rank, (url, _) in enumerate(results):
                host_port = url[len("http://"):].split("/")[0]
                self.assertEqual(workers.get(str(rank)), host_port, groups)
        finally:
            coordinator.terminate()
            coordinator.wait(timeout=30)
            coordinator.stdout.close()


if __name__ == "__main__":
    torch_testing.main()
