"""Test hosts on one machine: network namespaces joined by a veth pair (iproute2, as root), each
with its own address, host name and directory, for tests of what crosses a network
(tests/test_e2e_two_hosts.py; docs/TESTING.md, "Two hosts").

Every process of a host runs as ``ip netns exec NS unshare --uts --mount -- sh -c …``: in the
host's network namespace, under the host's own name (Celery's ``%h``), and with every *other*
host's directory hidden under an empty tmpfs, so a file one host writes (clock offset, Prometheus
files, logs) is not there for the other, as on two machines. Names are unique per run, so two runs
in parallel never collide; :meth:`Hosts.remove` ends every process in the namespaces and deletes them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsNotPermitted(Exception):
    """``ip netns add`` was refused (not root, no CAP_SYS_ADMIN, or no iproute2)."""


@dataclass
class Host:
    name: str        #: host name (``hostname`` inside, Celery's ``%h``)
    netns: str       #: network namespace
    address: str     #: its address on the veth
    dir: Path        #: its own directory (the other hosts see an empty tmpfs there)

    def wrap(self, command: list[str], hidden: list[Path]) -> list[str]:
        """``command`` run on this host: its namespace, its host name, the other hosts' directories hidden."""
        script = 'hostname "$1"; shift; while [ "$1" != -- ]; do mount -t tmpfs -o size=1m tmpfs "$1"; shift; done; ' \
                 'shift; exec "$@"'
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--mount", "--propagation", "private", "--",
                "sh", "-c", script, "sh", self.name, *map(str, hidden), "--", *command]

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """This thread in the host's network namespace (sockets opened inside stay there), then back."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/var/run/netns/{self.netns}", os.O_RDONLY)
        try:
            if _libc.setns(target, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {self.netns}")
            yield
        finally:
            _libc.setns(own, CLONE_NEWNET)
            os.close(own)
            os.close(target)


class Hosts:
    """Two hosts, ``a`` (10.231.0.1) and ``b`` (10.231.0.2), each in its own network namespace,
    joined by a veth pair; directories ``root/host-a`` and ``root/host-b``."""

    SUBNET = "10.231.0"

    def __init__(self, root: Path) -> None:
        run = uuid.uuid4().hex[:6]
        self.hosts = [Host(f"host{c}-{run}", f"notify-{run}-{c}", f"{self.SUBNET}.{i + 1}", root / f"host-{c}")
                      for i, c in enumerate("ab")]
        self._veth = [f"nv{run}{c}" for c in "ab"]
        self._made: list[str] = []

    def create(self) -> list[Host]:
        a, b = self.hosts
        try:
            for host in self.hosts:
                _ip("netns", "add", host.netns)
                self._made.append(host.netns)
                host.dir.mkdir(parents=True, exist_ok=True)
        except subprocess.CalledProcessError as exc:
            self.remove()
            raise NetnsNotPermitted(exc.stderr.strip() or str(exc)) from None
        except FileNotFoundError as exc:
            raise NetnsNotPermitted(f"no iproute2: {exc}") from None
        _ip("link", "add", self._veth[0], "type", "veth", "peer", "name", self._veth[1])
        for host, veth in zip(self.hosts, self._veth, strict=True):
            _ip("link", "set", veth, "netns", host.netns)
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", veth)
            _ip("-n", host.netns, "link", "set", veth, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
        return [a, b]

    def hidden_from(self, host: Host) -> list[Path]:
        return [h.dir for h in self.hosts if h is not host]

    def remove(self) -> None:
        """End every process still in the namespaces (ours: nothing else runs there), delete them (the
        veth pair goes with them)."""
        for netns in self._made:
            for _ in range(3):
                pids = _netns_pids(netns)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.3)
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        self._made = []


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _netns_pids(netns: str) -> list[int]:
    res = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in res.stdout.split()]
