"""Crash demo: kill the ticket agent with SIGKILL mid-effect, resume it, count the effects.

    python -m graph_durable.demo [--dir PATH]      (or: make demo)

1. The agent runs in a child process armed to die right after the ticket provider
   created the ticket and before the receipt is recorded in the ledger.
2. A new process resumes the thread. The ledger holds an intent without a receipt and
   the ticket provider answers lookups by key, so the receipt is recovered, not re-sent.
3. The email is sent, and each provider applied each key exactly once.
4. The thread is cancelled: the ticket is closed by its compensation (an effect of its
   own, keyed and journaled), the email is left in place, and the audit shows what ran
   again after the crash.
5. A second thread is killed right after its email left. The mail API can neither
   dedupe nor be asked, so the resumed thread does not send again: it waits for a
   person, who can answer it with the `graph-durable` commands the demo prints.
6. The same crash on stock LangGraph (`ToolNode` + `SqliteSaver`) opens a second ticket.

Exit code 0 only when the thread finished, every effect happened exactly once, the
cancel closed the ticket once, the second thread waits with its email sent once, and
stock LangGraph showed the duplicate.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from typing import Any

from graph_durable import DurableSqliteSaver, EffectRecord, EffectStatus, cancel
from graph_durable.demo.ticket import build_ticket_agent
from graph_durable.testing.crash.child import ChildResult, run_child
from graph_durable.faults import ENV_FAULTS, ENV_TRACE
from graph_durable.testing.faults import FaultPlan

FACTORY = "graph_durable.demo.ticket:build_ticket_agent"
THREAD = "ticket-1042"
STUCK = "ticket-1043"
OWN_FILES = {"agent.sqlite", "agent.sqlite-wal", "agent.sqlite-shm", "providers",
             "stock.sqlite", "stock.sqlite-wal", "stock.sqlite-shm", "stock-providers"}
COLOUR = sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def paint(text: str, code: str) -> str:
    return f"\033[{code}m{text}\033[0m" if COLOUR else text


def header(title: str) -> None:
    print("\n" + paint(f"== {title} " + "=" * max(0, 72 - len(title)), "1;36"))


def short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[: width - 3] + "..."


def fresh_dir(path: str) -> str:
    """Wipe `path`, but only if it is empty or holds nothing but a previous demo run."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        if stray := sorted(set(os.listdir(path)) - OWN_FILES):
            sys.exit(f"refusing to wipe {path}: it holds files the demo did not create "
                     f"({', '.join(stray[:3])}); pass another --dir")
        shutil.rmtree(path)
    os.makedirs(path)
    return path


def show_ledger(db: str) -> list[EffectRecord]:
    """Print the thread's ledger rows, read by a fresh saver on the agent's database."""
    with DurableSqliteSaver.from_conn_string(db) as saver:
        effects = saver.effects(THREAD)
    print(f"    {'tool':<14}{'status':<11}{'attempts':<10}{'key':<18}receipt")
    for e in effects:
        receipt = e.receipt.get("id", e.receipt) if isinstance(e.receipt, dict) else e.receipt
        print(f"    {e.tool:<14}{e.status.value:<11}{e.attempts:<10}{short(e.key, 16):<18}"
              + ("(none)" if receipt is None else short(receipt, 20)))
    return effects


def show_messages(result: ChildResult) -> None:
    for m in result.summary.get("messages", []):
        calls = ", ".join(f"{c['name']}({', '.join(map(str, c['args'].values()))})"
                          for c in m.get("tool_calls", []))
        print(f"    {m['type']:<6} {short(m['content']) if m['content'] else '-> ' + calls}")


def stock_crash(workdir: str) -> int:
    """Kill the stock agent after its ticket, resume it; the tickets its provider holds."""
    from graph_durable.demo.stock import build_stock_graph

    args = ["--db", os.path.join(workdir, "stock.sqlite"),
            "--providers", os.path.join(workdir, "stock-providers"), "--thread", THREAD]
    env = {k: v for k, v in os.environ.items() if k not in (ENV_FAULTS, ENV_TRACE)}
    for extra in (["--crash"], []):
        subprocess.run([sys.executable, "-m", "graph_durable.demo.stock", *args, *extra],
                       env=env, check=False, capture_output=True)
    graph, tickets = build_stock_graph(args[1], args[3])
    graph.checkpointer.conn.close()
    return tickets.count()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graph_durable.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="demo-run",
                        help="working directory, wiped first (default: ./demo-run)")
    workdir = fresh_dir(parser.parse_args(argv).dir)
    db = os.path.join(workdir, "agent.sqlite")
    kwargs = {"db_path": db, "provider_dir": os.path.join(workdir, "providers"),
              "ticket_mode": "lookup", "email_mode": "blind"}
    scenario = build_ticket_agent(**kwargs)  # built here only for its providers
    scenario.saver.conn.close()
    tickets, mail = scenario.tickets, scenario.mail
    problems: list[str] = []

    header("1. Setup")
    print(f"  working dir  {workdir}")
    print(f"  ticket API   {tickets.mode:<7} no dedupe, but answers 'is there a ticket for key K?'")
    print(f"  email API    {mail.mode:<7} no dedupe, no lookup: after a crash, a person decides")

    header("2. Run the agent, SIGKILL it after the ticket, before the receipt")
    crash = run_child(FACTORY, kwargs, thread_id=THREAD, action="start",
                      fault=FaultPlan("after_effect", tool="create_ticket"))
    print(f"  child exit code {crash.returncode}: "
          + (paint("killed by SIGKILL", "1;31") if crash.killed else "NOT killed"))
    print("  ledger at the moment of the crash:")
    at_crash = show_ledger(db)
    print(f"  ticket provider already holds {tickets.count()} ticket(s)")
    if not crash.killed or tickets.count() != 1 or [(e.status, e.receipt) for e in at_crash] \
            != [(EffectStatus.IN_FLIGHT, None)]:
        problems.append("the crash did not leave 1 ticket and 1 in_flight intent without receipt")

    header("3. Resume the thread in a new process")
    done = run_child(FACTORY, kwargs, thread_id=THREAD, action="resume")
    print(f"  child exit code {done.returncode}, thread finished: {done.done}")
    with DurableSqliteSaver.from_conn_string(db) as saver:
        events, tools = saver.events(THREAD), {e.key: e.tool for e in saver.effects(THREAD)}
    looked_up = {e.seq for e in events if e.kind == "receipt" and e.data.get("source") == "lookup"}
    print("  journal:")
    for ev in events:
        data = " ".join(f"{k}={v}" for k, v in ev.data.items() if k not in ("tool", "tool_call_id"))
        line = f"    #{ev.seq:<3}{tools.get(ev.key, '?'):<14}{ev.kind:<8}{data}"
        print(paint(line + "   <- recovered by lookup, not re-sent", "33")
              if ev.seq in looked_up else line)
    if not done.done:
        problems.append("the thread did not finish")
    if not any(tools.get(ev.key) == "create_ticket" for ev in events if ev.seq in looked_up):
        problems.append("the ticket's receipt was not recovered by lookup")

    header("4. Result")
    print("  conversation:")
    show_messages(done)
    print("  ledger:")
    ledger = show_ledger(db)
    print("  effects applied by the providers, per key:")
    for provider, tool in ((tickets, "create_ticket"), (mail, "send_email")):
        keys, counts = [e.key for e in ledger if e.tool == tool], provider.counts()
        if not keys or counts != {key: 1 for key in keys}:
            problems.append(f"{provider.name}: expected 1 effect per key, got {counts or 'none'}")
        for key in sorted(set(keys) | set(counts)):
            n = counts.get(key, 0)
            print(f"    {provider.name:<8}{short(key, 16):<18}"
                  + paint(f"{n} effect{'s' * (n != 1)}", "32" if n == 1 else "1;31"))

    header("5. Cancel the thread: undo what can be undone, newest first")
    agent = build_ticket_agent(**kwargs)
    report = cancel(agent.graph, agent.saver, THREAD, owner="demo-operator")
    for outcome, records in (("compensated", report.compensated),
                             ("left in place", report.left_in_place),
                             ("needs a human", report.needs_human)):
        for record in records:
            print(f"    {record.tool:<14}{outcome}")
    closed = tickets.count(operation="close")
    print(f"  ticket provider closed {closed} ticket(s); emails sent: {mail.count()}")
    if closed != 1 or [r.tool for r in report.compensated] != ["create_ticket"]:
        problems.append(f"the cancel closed {closed} ticket(s), expected 1")

    header("6. Audit: what ran again after the crash")
    for line in agent.saver.audit(THREAD).summary().splitlines():
        print(f"    {line}")
    agent.saver.conn.close()

    header("7. A second thread, killed right after its email left")
    run_child(FACTORY, kwargs, thread_id=STUCK, action="start",
              fault=FaultPlan("after_effect", tool="send_email"))
    paused = run_child(FACTORY, kwargs, thread_id=STUCK, action="resume")
    with DurableSqliteSaver.from_conn_string(db) as saver:
        stuck = {e.tool: e for e in saver.effects(STUCK)}
    email = stuck.get("send_email")
    sent = [m for m in mail.effects() if email is not None and m["key"] == email.key]
    print(f"  resumed: the email's outcome is {email.status.value if email else '?'}; the mail "
          f"API holds {len(sent)} email(s) for it, and nothing was re-sent")
    print(f"  the thread waits for a person: {', '.join(i['type'] for i in paused.interrupts)}")
    if email is None or email.status is not EffectStatus.UNKNOWN or len(sent) != 1:
        problems.append("the second thread did not pause with its email sent once")

    header("8. The same crash on stock LangGraph (ToolNode + SqliteSaver, no guard)")
    stock = stock_crash(workdir)
    print(f"  killed after the ticket, resumed: the ticket provider holds "
          + paint(f"{stock} tickets", "1;31" if stock > 1 else "32")
          + (" (the resumed step opened it again)" if stock > 1 else ""))
    if stock != 2:
        problems.append(f"stock LangGraph was expected to open 2 tickets, opened {stock}")

    header("9. Look at it yourself")
    where = os.path.relpath(db)
    env = "" if os.path.relpath(workdir) == "demo-run" else \
        f"GRAPH_DURABLE_DEMO_DIR={shlex.quote(os.path.relpath(workdir))} "
    receipt = json.dumps(sent[0]["receipt"], sort_keys=True) if sent else "{}"
    for line in (f"graph-durable threads --db {where}",
                 f"graph-durable pending --db {where}",
                 f"graph-durable show {STUCK} --db {where}",
                 f"{env}graph-durable resolve {STUCK} call_email --applied "
                 f"--receipt {shlex.quote(receipt)} --db {where} "
                 "--graph graph_durable.demo.ticket:graph"):
        print(f"    {line}")
    print("  (the command is in .venv/bin; the receipt above is what the mail API holds)")

    print(paint("OK: killed mid-effect, resumed, and every effect happened exactly once.", "1;32"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
