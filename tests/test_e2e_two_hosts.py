"""Two hosts drain one segment's campaigns (issue 25, part 5): host A (10.231.0.1) runs its own
Postgres and Redis (scripts/devservices.py on A's address), the emulator, web, beat and a worker of
every kind; host B (10.231.0.2) runs a second set of send workers (high, standard, fan-out) and a
web process for its ``/metrics``, reaching Postgres, Redis and the emulator over the veth, never
127.0.0.1. Each host has its own network namespace, host name and directory (tests/hosts.py).

What must hold for many hosts (docs/OPERATIONS.md, "More than one host"): every member is sent once
(rows, attempts, what the emulator received); both hosts sent part; nothing is tied to one machine:
node names carry each host's name, each host's Prometheus files are its own processes' and its
``/metrics`` sums them (A + B = every send), and the test clock offset, a per-host file, reaches B's
workers (their attempt rows carry the moved clock). Skipped only when network namespaces cannot be made.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from bench.stack import ROOT, Stack, wait_until
from tests.hosts import Host, Hosts, NetnsNotPermitted

pytestmark = [pytest.mark.e2e, pytest.mark.serial]

MEMBERS = 2000
CHANNELS = ("email", "sms")
#: The test clock moves this far ahead on every host before the campaigns start.
CLOCK_OFFSET = 3600
METRICS_TOKEN = secrets.token_urlsafe(32)
#: The variables of this session's own servers: a host's processes get its hosts' instead.
OWN = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "PG_PORT", "REDIS_PORT", "PROMETHEUS_MULTIPROC_DIR",
       "CLOCK_OFFSET_FILE", "DEVSERVICES_DIR", "DEVSERVICES_HOST", "PYTEST_XDIST_WORKER")


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in OWN}


class HostStack(Stack):
    """:class:`bench.stack.Stack` on one test host: every process wrapped by :meth:`Host.wrap`, its
    Prometheus directory, clock-offset file and logs in the host's own directory, the services and
    the emulator at host A's address."""

    def __init__(self, host: Host, hosts: Hosts, database_url: str, redis_url: str, emulator_host: str,
                 names: tuple[str, ...], static_root: Path) -> None:
        super().__init__(database_url, redis_url, host.dir, static_root=static_root)
        self.host, self.hosts, self.emulator_host, self.names = host, hosts, emulator_host, names
        self.public_port = self.api_port
        (host.dir / "prometheus").mkdir(exist_ok=True)
        (host.dir / "logs").mkdir(exist_ok=True)

    @property
    def emulator(self) -> str:
        return f"http://{self.emulator_host}:{self.emulator_port}"

    def env(self) -> dict[str, str]:
        env = super().env()  # the services' URLs and this host's clock-offset file, from the constructor
        for key in ("PG_PORT", "REDIS_PORT", "DEVSERVICES_DIR", "DEVSERVICES_HOST", "PYTEST_XDIST_WORKER"):
            env.pop(key, None)
        env.update({
            "PROMETHEUS_MULTIPROC_DIR": str(self.host.dir / "prometheus"),
            "METRICS_TOKEN": METRICS_TOKEN,
            "ALLOWED_HOSTS": ",".join(["127.0.0.1", "localhost"] + [h.address for h in self.hosts.hosts]),
            # Web on A answers the emulator's receipts on loopback and the other hosts on the veth
            # (every address of A's own network namespace).
            "WEB_HOST": "0.0.0.0" if self.host is self.hosts.hosts[0] else self.host.address,  # noqa: S104
            "EMULATOR_HOST": self.emulator_host,
            # Where the providers reach the webhooks: host A's web (the emulator runs there too).
            "PUBLIC_BASE_URL": f"http://127.0.0.1:{self.public_port}",
            "EMULATOR_RECEIPTS": "0",  # every row ends `sent` by its worker: exact counts per host
        })
        return env

    def commands(self) -> dict[str, list[str]]:
        hidden = self.hosts.hidden_from(self.host)
        return {name: self.host.wrap(cmd, hidden) for name, cmd in super().commands().items() if name in self.names}

    def log_path(self, name: str) -> Path:
        return self.host.dir / "logs" / f"{name}.log"

    def start_all(self) -> None:
        for name in self.names:
            self.start(name)


@pytest.fixture
def two_hosts(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    hosts = Hosts(tmp_path)
    try:
        a, b = hosts.create()
    except NetnsNotPermitted as exc:
        pytest.skip(f"ip netns add is not permitted here: {exc}")
    except BaseException:
        hosts.remove()
        raise
    stacks: list[HostStack] = []
    services_env = {**base_env(), "DEVSERVICES_DIR": str(a.dir / "services"), "DEVSERVICES_HOST": a.address}
    try:
        run_on(a, hosts, [sys.executable, "scripts/devservices.py", "up"], services_env)
        values = dict(line.split("=", 1) for line in (a.dir / "services" / "env").read_text().splitlines()
                      if "=" in line and not line.startswith("#"))
        yield hosts, a, b, values, stacks
    finally:
        for s in stacks:
            s.stop_all()
        subprocess.run(a.wrap([sys.executable, "scripts/devservices.py", "down"], hosts.hidden_from(a)),
                       cwd=ROOT, env=services_env, capture_output=True, timeout=60)
        hosts.remove()
        shutil.rmtree(a.dir / "services", ignore_errors=True)  # Postgres' data; the hosts' logs stay


def run_on(host: Host, hosts: Hosts, command: list[str], env: dict[str, str]) -> str:
    res = subprocess.run(host.wrap(command, hosts.hidden_from(host)), cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, f"{command} on {host.name}:\n{res.stdout}\n{res.stderr}"
    return res.stdout


SEED = """
from notifications.models import APIClient
from preferences.models import Recipient
from core.api.scopes import Scope
_, key = APIClient.objects.create_key(name="two-hosts", allow_high=True, scopes=list(Scope.values))
Recipient.objects.bulk_create([Recipient(user_id=f"m-{i:05d}", email=f"m-{i:05d}@example.com",
                                         phone=f"+49151{i:08d}", timezone="Europe/Berlin", locale="en")
                               for i in range(%d)], batch_size=1000)
print("KEY=" + key)
""".replace("%d", str(MEMBERS))


def scrape(url: str) -> dict[str, float]:
    """``/metrics`` of one host: every sample by name and labels."""
    r = requests.get(f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10)
    assert r.status_code == 200, r.text[:300]
    return {f"{s.name}{sorted(s.labels.items())}": s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def sent_by(samples: dict[str, float], channel: str) -> float:
    """Notifications a host's standard workers sent on ``channel`` (accept → provider observations)."""
    return sum(v for k, v in samples.items()
               if k.startswith("notify_accept_to_provider_seconds_count") and f"('channel', '{channel}')" in k)


def test_two_hosts_drain_a_campaign_each_sending_part(two_hosts, static_root):
    hosts, a, b, values, stacks = two_hosts
    env = {**base_env(), "DATABASE_URL": values["DATABASE_URL"], "REDIS_URL": values["REDIS_URL"],
           "DJANGO_SETTINGS_MODULE": "config.settings"}
    assert "127.0.0.1" not in values["DATABASE_URL"] + values["REDIS_URL"]
    run_on(a, hosts, [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], env)
    key = re.search(r"KEY=(\S+)", run_on(a, hosts, [sys.executable, "manage.py", "shell", "-c", SEED], env)).group(1)

    stack_a = HostStack(a, hosts, values["DATABASE_URL"], values["REDIS_URL"], a.address,
                        ("emulator", "web", "worker_high", "worker_standard", "worker_fanout", "worker_maintenance",
                         "worker_receipts", "beat"), static_root)
    stack_b = HostStack(b, hosts, values["DATABASE_URL"], values["REDIS_URL"], a.address,
                        ("web", "worker_high", "worker_standard", "worker_fanout"), static_root)
    stack_b.emulator_port, stack_b.smtp_port, stack_b.public_port = (stack_a.emulator_port, stack_a.smtp_port,
                                                                     stack_a.api_port)
    stacks += [stack_a, stack_b]
    for s in stacks:
        # The clock offset is per-host configuration (a file on each host): every host's is set.
        s.set_clock_offset(CLOCK_OFFSET)
        s.start_all()

    with a.entered():  # this thread's sockets: in host A's network, as a client on A would be
        from celery import Celery

        broker = Celery(broker=values["REDIS_URL"], set_as_current=False)
        expected_nodes = {f"{kind}@{h.name}" for h in (a, b) for kind in ("high", "standard", "fanout")}
        expected_nodes |= {f"{kind}@{a.name}" for kind in ("maintenance", "receipts")}

        def nodes():
            seen = {next(iter(r)) for r in broker.control.ping(timeout=1) or []}
            return seen if seen >= expected_nodes else None

        assert wait_until(nodes, 120, interval=1, message="every worker of both hosts") == expected_nodes
        api = f"http://127.0.0.1:{stack_a.api_port}"
        wait_until(lambda: Stack._get(f"{api}/healthz"), 60, message="web on A")
        wait_until(lambda: Stack._get(f"http://{b.address}:{stack_b.api_port}/healthz"), 60, message="web on B")
        session = requests.Session()
        session.headers["Authorization"] = f"Api-Key {key}"
        members = [f"m-{i:05d}" for i in range(MEMBERS)]
        assert session.put(f"{api}/v1/segments/seg-two-hosts", json={"name": "two hosts"}).status_code == 201
        r = session.post(f"{api}/v1/segments/seg-two-hosts/members", json={"add": members})
        assert r.status_code == 200, r.text
        started = datetime.now(UTC)
        campaigns = {}
        for channel in CHANNELS:
            body = {"segment_id": "seg-two-hosts", "channel": channel,
                    "content": {"body": "hello"} if channel == "sms" else {"title": "t", "body": "hello"}}
            r = session.post(f"{api}/v1/campaigns", json=body, headers={"Idempotency-Key": f"two-hosts-{channel}"})
            assert r.status_code == 202, r.text
            campaigns[channel] = r.json()["id"]

        def completed():
            bodies = [session.get(f"{api}/v1/campaigns/{cid}").json() for cid in campaigns.values()]
            return bodies if all(x["status"] == "completed" for x in bodies) else None

        wait_until(completed, 300, interval=1, message="both campaigns completed")

        ids = list(campaigns.values())
        with psycopg.connect(values["DATABASE_URL"].replace("postgres://", "postgresql://")) as db:
            rows = db.execute(
                "SELECT n.channel, n.status, count(*), count(DISTINCT n.recipient_id) FROM notifications_notification n"
                " WHERE n.campaign_id::text = ANY(%s) GROUP BY 1, 2 ORDER BY 1, 2", [ids]).fetchall()
            attempts = db.execute(
                "SELECT n.channel, a.outcome, count(*), count(DISTINCT a.notification_id), min(a.created_at)"
                " FROM notifications_deliveryattempt a JOIN notifications_notification n ON n.id = a.notification_id"
                " WHERE n.campaign_id::text = ANY(%s) GROUP BY 1, 2 ORDER BY 1, 2", [ids]).fetchall()
        messages = requests.get(f"{stack_a.emulator}/_emulator/messages", timeout=(5, 60)).json()
        metrics_a = scrape(f"http://{a.address}:{stack_a.api_port}")
        metrics_b = scrape(f"http://{b.address}:{stack_b.api_port}")

    # Every member sent once: rows, attempts (one accepted call each), what the provider received.
    assert [r[:4] for r in rows] == [("email", "sent", MEMBERS, MEMBERS), ("sms", "sent", MEMBERS, MEMBERS)]
    assert [a_[:4] for a_ in attempts] == [("email", "accepted", MEMBERS, MEMBERS),
                                           ("sms", "accepted", MEMBERS, MEMBERS)]
    for channel in CHANNELS:
        got = [m for m in messages if m["channel"] == channel]
        assert len(got) == MEMBERS
        assert len({m["notification_id"] for m in got}) == MEMBERS
    # The clock offset reached every worker, B's included: no attempt carries the real time.
    moved = started + timedelta(seconds=CLOCK_OFFSET - 60)
    assert [(a_[0], a_[4] >= moved) for a_ in attempts] == [("email", True), ("sms", True)], attempts
    # Both hosts sent part of each campaign; each host's /metrics sums its own processes only.
    for channel in CHANNELS:
        on_a, on_b = sent_by(metrics_a, channel), sent_by(metrics_b, channel)
        assert (on_a + on_b, on_a > 0, on_b > 0) == (MEMBERS, True, True), (channel, on_a, on_b)
    # Each host's Prometheus files are its own processes' (pids in its namespace), never the other's.
    files = {h.name: {int(p.stem.rsplit("_", 1)[1]) for p in (h.dir / "prometheus").glob("*.db")} for h in (a, b)}
    live = {h.name: set(map(int, subprocess.run(["ip", "netns", "pids", h.netns], capture_output=True,
                                                text=True).stdout.split())) for h in (a, b)}
    assert files[a.name] and files[b.name]
    assert files[a.name].isdisjoint(live[b.name]) and files[b.name].isdisjoint(live[a.name])
    # Nothing written into the other host's directory: B's tmpfs over A's hid it, and A's is A's.
    assert sorted(p.name for p in b.dir.iterdir()) == ["clock-offset", "logs", "prometheus", "sendgrid-signing-key.pem"]
