"""What a run leaves behind in its output folder: results.json (every figure, the parameters,
the time series), four PNG plots, and report.html, one page with all of it. Also the terminal
summary table. Everything here works from the results dict alone, so a report can be rebuilt
from results.json.
"""

from __future__ import annotations

import html
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from node.figures import embedded, save
from node.tools.loadtest.histogram import LogHistogram

PLOTS = {
    "throughput.png": "Throughput over time",
    "ack_latency_cdf.png": "Publish-ack latency (CDF)",
    "e2e_latency_hist.png": "End-to-end latency (produce to consume)",
    "node_resources.png": "Node CPU and memory over time",
}


def _ms(micros: float | None) -> str:
    if micros is None:
        return "-"
    return f"{micros / 1000:,.2f} ms" if micros >= 1000 else f"{micros:,.0f} µs"


def summary_rows(results: dict) -> list[tuple[str, str]]:
    s = results["summary"]
    rows = [("produced (stored)", f"{s['produced']:,} msgs"),
            ("produce rate", f"{s['produceRate']:,.0f} msgs/s, {s['produceMBps']:,.1f} MB/s"),
            ("publish-ack latency", " / ".join(f"p{k} {_ms(s['ack'].get(k))}" for k in ("50", "90", "99", "99.9"))
             + f" / max {_ms(s['ack'].get('max'))}")]
    if results["params"]["consumers"]:
        rows += [("consumed", f"{s['consumed']:,} msgs"),
                 ("consume rate", f"{s['consumeRate']:,.0f} msgs/s, {s['consumeMBps']:,.1f} MB/s"),
                 ("end-to-end latency", " / ".join(f"p{k} {_ms(s['e2e'].get(k))}" for k in ("50", "99"))
                  + f" / max {_ms(s['e2e'].get('max'))}"),
                 ("max consumer lag", f"{s['maxLag']:,} msgs")]
    errors = ", ".join(f"{k} {v:,}" for k, v in sorted(s["errors"].items())) or "none"
    rows.append(("errors", errors))
    if s.get("cpuMean") is not None:
        rows.append(("node CPU", f"mean {s['cpuMean']:.0f}%, max {s['cpuMax']:.0f}% (100% = one core)"))
        if s.get("anonMax") is not None:
            rows.append(("node memory", f"anonymous {s['anonFirst'] / 2**20:,.0f} -> max {s['anonMax'] / 2**20:,.0f} MiB; "
                                        f"PSS max {s['pssMax'] / 2**20:,.0f} MiB, of it mapped files "
                                        f"{s['pssFileMax'] / 2**20:,.0f} MiB (page cache; RSS summed over processes, "
                                        f"shared pages counted in each: {s['rssMax'] / 2**20:,.0f} MiB)"))
    if results.get("chaos") is not None:
        rows.append(("chaos", f"{len(results['chaos'])} strikes: "
                     + ", ".join(e["target"] for e in results["chaos"])))
    copied = results.get("replication")
    if copied is not None:
        rows.append(("slave", f"CommitLog identical to the master's, {copied['comparedBytes']:,} bytes" if copied["ok"]
                     else f"FAILED: {copied['problem']}"))
        pop = copied.get("popLog")  # (results of runs before the pop log's copy have none)
        if pop is not None:
            rows.append(("slave's pop log", f"identical to the master's, {pop['bytes']:,} bytes" if pop["ok"]
                         else f"FAILED: {pop['problem']}"))
    verdict = results.get("verify")
    if verdict is not None:
        again = verdict["counts"].get("redelivered")  # (--pop: at least once)
        rows.append(("verify", ("PASSED" + (f", {again:,} handed out again" if again is not None else ""))
                     if verdict["ok"] else
                     "FAILED: " + ", ".join(f"{k} {v['count']:,}" for k, v in verdict["findings"].items())))
    return rows


def print_summary(results: dict, console: Console) -> None:
    table = Table(title=f"mqnode loadtest {results['params'].get('scenario') or ''}".strip(), show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for name, value in summary_rows(results):
        table.add_row(name, value)
    console.print(table)
    if results.get("profile"):
        profile = Table(title="where the time goes (CPU seconds from the OS; top functions by py-spy self time)")
        profile.add_column("process", style="bold")
        profile.add_column("CPU s", justify="right")
        profile.add_column("top functions")
        for label, p in results["profile"].items():
            top = ", ".join(f"{t['function']} {100 * t['share']:.0f}%" for t in p["top"][:3]) or p.get("error", "")
            cpu = p.get("cpuSeconds")
            profile.add_row(label, "-" if cpu is None else f"{cpu:.1f}", top)
        console.print(profile)


def write_all(results: dict, output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    (output / "results.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))
    write_plots(results, output)
    (output / "report.html").write_text(render_html(results, output))


def write_plots(results: dict, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = results["series"]
    t = [p["t"] for p in series]
    strikes = [e["t"] - results["started"] for e in results.get("chaos") or [] if "t" in e]

    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(t, [p["produceRate"] for p in series], label="produce (acked)")
    if results["params"]["consumers"]:
        ax.plot(t, [p["consumeRate"] for p in series], label="consume")
    for x in strikes:
        ax.axvline(x, color="red", alpha=0.4, linestyle="--")
    ax.set(xlabel="seconds", ylabel="msgs/s", title=PLOTS["throughput.png"])
    ax.legend(loc="best")
    save(fig, output / "throughput.png", plt)

    fig, ax = plt.subplots(figsize=(8, 3.6))
    values, counts = LogHistogram.from_sparse(results["histograms"]["ack"]).points()
    if len(values):
        ax.plot(values / 1000, counts.cumsum() / counts.sum() * 100, drawstyle="steps-post")
        ax.set_xscale("log")
    ax.set(xlabel="ms (log)", ylabel="% of sends acked within", title=PLOTS["ack_latency_cdf.png"], ylim=(0, 100.5))
    ax.grid(True, which="both", alpha=0.3)
    save(fig, output / "ack_latency_cdf.png", plt)

    fig, ax = plt.subplots(figsize=(8, 3.6))
    values, counts = LogHistogram.from_sparse(results["histograms"]["e2e"]).points()
    if len(values):
        ax.bar(values / 1000, counts, width=values / 1000 * 0.02, align="edge")
        ax.set_xscale("log")
    ax.set(xlabel="ms (log)", ylabel="messages", title=PLOTS["e2e_latency_hist.png"])
    save(fig, output / "e2e_latency_hist.png", plt)

    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(t, [p["cpu"] for p in series], color="tab:blue", label="CPU %")
    ax.set(xlabel="seconds", ylabel="CPU % (100 = one core)", title=PLOTS["node_resources.png"])
    right = ax.twinx()
    for key, color, label in (("anon", "tab:orange", "anonymous MiB"), ("pss", "tab:green", "PSS MiB"),
                              ("pssFile", "tab:olive", "PSS of mapped files MiB")):
        right.plot(t, [p[key] / 2**20 if p.get(key) is not None else None for p in series], color=color, label=label)
    right.set_ylabel("MiB (anonymous, PSS)")
    ax.set_ylim(bottom=0)
    right.set_ylim(bottom=0)
    fig.legend(loc="upper right", bbox_to_anchor=(0.88, 0.88))
    for x in strikes:
        ax.axvline(x, color="red", alpha=0.4, linestyle="--")
    save(fig, output / "node_resources.png", plt)


def render_html(results: dict, output: Path) -> str:
    """One self-contained page: the plots are embedded, so the file can be mailed on its own."""
    e = html.escape
    params = results["params"]
    rows = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in summary_rows(results))
    settings = "".join(f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in params.items() if v not in (None, [], ""))
    images = embedded(output, PLOTS)
    verdict = results.get("verify")
    verify = ""
    if verdict is not None:
        status = "passed" if verdict["ok"] else "FAILED"
        details = "".join(f"<li><b>{e(k)}</b>: {v['count']:,}<ul>" + "".join(f"<li>{e(x)}</li>" for x in v["examples"])
                          + "</ul></li>" for k, v in verdict["findings"].items())
        counts = ", ".join(f"{k} {v:,}" for k, v in verdict["counts"].items())
        verify = f'<h2>Verification: <span class="{status.lower()}">{status}</span></h2><p>{e(counts)}</p><ul>{details}</ul>'
    chaos = ""
    if results.get("chaos") is not None:
        items = "".join(f"<li>+{ev['t'] - results['started']:.1f} s: kill -9 <b>{e(ev['target'])}</b>"
                        + (f", back after {ev['recoveredAfter']:.1f} s" if "recoveredAfter" in ev else f": {e(ev.get('error', ''))}")
                        + "</li>" for ev in results["chaos"])
        chaos = f"<h2>Chaos</h2><ul>{items or '<li>no strikes</li>'}</ul>"
    profile = ""
    if results.get("profile"):
        blocks = ""
        for label, p in results["profile"].items():
            items = "".join(f"<tr><td>{100 * t['share']:.1f}%</td><td><code>{e(t['function'])}</code></td></tr>" for t in p["top"])
            cpu = p.get("cpuSeconds")
            note = e(p.get("error", "")) or (f"{cpu:.1f} CPU seconds" if cpu is not None else "") \
                + f", {p['samples']:,} samples holding the GIL"
            blocks += f"<div><h3>{e(label)}</h3><p>{note}</p><table>{items}</table></div>"
        profile = f'<h2>Where the time goes (py-spy, self time)</h2><div class="grid">{blocks}</div>'
    title = f"mqnode loadtest: {params.get('scenario') or 'custom run'}"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{e(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1em; }} th, td {{ text-align: left; padding: 3px 12px; border-bottom: 1px solid #ddd; }}
.grid {{ display: grid; grid-template-columns: 1fr 1fr; gap: 8px; }} img {{ width: 100%; }}
figure {{ margin: 0; }} figcaption {{ color: #666; font-size: 90%; }}
.passed {{ color: #080; }} .failed {{ color: #c00; }} .cols {{ display: flex; gap: 2em; align-items: flex-start; }}
</style></head><body>
<h1>{e(title)}</h1>
<p>Run {e(str(results['runId']))} on {e(results['machine']['host'])} ({results['machine']['cores']} cores), started {e(results['startedText'])}, {results['elapsed']:.1f} s. Command: <code>{e(results['command'])}</code></p>
<div class="cols"><div><h2>Figures</h2><table>{rows}</table></div><div><h2>Parameters</h2><table>{settings}</table></div></div>
{verify}{chaos}
<div class="grid">{images}</div>
{profile}
</body></html>
"""
