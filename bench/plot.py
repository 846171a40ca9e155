"""The results PNG (matplotlib, Agg): deliveries/s per tier over time, and OTP latency over time; one
column per run (tiered, naive)."""

from __future__ import annotations

from pathlib import Path


def write_plot(report: dict, path: Path) -> None:
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
        top.legend(loc="upper right", fontsize=8)
        colors = {"sms": "tab:orange", "email": "tab:blue", "push": "tab:green"}
        for channel in sorted({p[2] for p in tl["otp"]}):
            pts = [p for p in tl["otp"] if p[2] == channel]
            bottom.scatter([p[0] for p in pts], [max(p[1], 0.1) for p in pts], s=6, label=f"OTP {channel}",
                           color=colors.get(channel))
        bottom.axhline(1000, color="red", linestyle="--", linewidth=0.8, label="1 s target (p99)")
        p99 = run["otp"]["latency_ms"]["p99"]
        if p99 is not None:
            bottom.axhline(p99, color="black", linestyle=":", linewidth=0.8, label=f"p99 {p99:,.0f} ms")
        if tl.get("brownout_s") is not None:
            for ax in (top, bottom):
                ax.axvline(tl["brownout_s"], color="purple", linestyle="--", label="brownout")
        bottom.set_yscale("log")
        bottom.set_title(f"{name}: OTP accept → provider latency")
        bottom.set_xlabel("seconds since launch (OTP accept instant)")
        bottom.set_ylabel("ms (log)")
        bottom.legend(loc="upper right", fontsize=8)
    fig.suptitle(f"manage.py bench — {report.get('started_at', '')} — {report.get('git', {}).get('commit', '')[:10]}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
