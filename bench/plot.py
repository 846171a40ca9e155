"""The results PNG (matplotlib, Agg): deliveries/s per tier over time, and OTP latency over time; one
column per run (tiered, naive). The event blast's (:func:`write_events_plot`): events accepted/s and
notifications delivered/s per channel over time, and OTP latency over time."""

from __future__ import annotations

from pathlib import Path

COLORS = {"sms": "tab:orange", "email": "tab:blue", "push": "tab:green"}


def _pyplot():
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plot(report: dict, path: Path) -> None:
    plt = _pyplot()
    runs = [(name, report[name]["run"]) for name in ("tiered", "naive") if report.get(name)]
    if not runs:
        return
    fig, axes = plt.subplots(2, len(runs), figsize=(7 * len(runs), 7), squeeze=False)
    for col, (name, run) in enumerate(runs):
        tl = run["timeline"]
        start = tl.get("start_s", 0.0)
        top, bottom = axes[0][col], axes[1][col]
        xs = [start + i for i in range(len(tl["standard_per_s"]))]
        top.plot(xs, tl["standard_per_s"], label="standard tier (campaign)", color="tab:blue")
        top.plot(xs[:len(tl["high_per_s"])], tl["high_per_s"], label="high tier (OTP)", color="tab:red")
        top.set_title(f"{name}: {report[name]['recipients']:,} × {report[name]['channel']} — deliveries/s")
        top.set_xlabel("seconds since launch")
        top.set_ylabel("deliveries per second")
        fan = run["fanout"].get("seconds")
        if fan is not None:
            top.axvline(fan, color="grey", linestyle=":", label=f"fan-out done ({fan:.1f} s)")
        if tl.get("brownout_s") is not None:
            for ax in (top, bottom):
                ax.axvline(tl["brownout_s"], color="purple", linestyle="--", label="brownout")
        top.legend(loc="upper right", fontsize=8)
        _otp_panel(bottom, tl, run["otp"]["latency_ms"]["p99"], f"{name}: OTP accept → provider latency")
    fig.suptitle(f"manage.py bench — {report.get('started_at', '')} — {report.get('git', {}).get('commit', '')[:10]}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _otp_panel(ax, tl: dict, p99: float | None, title: str) -> None:
    for channel in sorted({p[2] for p in tl["otp"]}):
        pts = [p for p in tl["otp"] if p[2] == channel]
        ax.scatter([p[0] for p in pts], [max(p[1], 0.1) for p in pts], s=6, label=f"OTP {channel}",
                   color=COLORS.get(channel))
    ax.axhline(1000, color="red", linestyle="--", linewidth=0.8, label="1 s target (p99)")
    if p99 is not None:
        ax.axhline(p99, color="black", linestyle=":", linewidth=0.8, label=f"p99 {p99:,.0f} ms")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel("seconds since launch (OTP accept instant)")
    ax.set_ylabel("ms (log)")
    ax.legend(loc="upper right", fontsize=8)


def write_events_plot(report: dict, path: Path) -> None:
    """The event blast's PNG: events accepted/s and notifications delivered/s per channel (top), OTP
    accept → provider latency (bottom), both against seconds since launch."""
    run = (report.get("events") or {}).get("run")
    if not run:
        return
    plt = _pyplot()
    tl = run["timeline"]
    start = tl.get("start_s", 0.0)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7))
    xs = [start + i for i in range(len(tl["accepted_per_s"]))]
    top.plot(xs, tl["accepted_per_s"], label="events accepted (202)", color="black")
    for channel, series in tl["delivered_per_s"].items():
        top.plot(xs[:len(series)], series, label=f"{channel} delivered", color=COLORS.get(channel))
    top.set_title(f"{report['events']['events']:,} events (push + email) over {report['events']['concurrency']} "
                  "connections — per second")
    top.set_xlabel("seconds since launch")
    top.set_ylabel("per second")
    top.legend(loc="upper right", fontsize=8)
    _otp_panel(bottom, tl, run["otp"]["latency_ms"]["p99"], "OTP accept → provider latency during the event blast")
    fig.suptitle(f"manage.py bench --scenario events — {report.get('started_at', '')} — "
                 f"{report.get('git', {}).get('commit', '')[:10]}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
