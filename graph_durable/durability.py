"""What the guarantee's durability rests on: runs that checkpoint before they send
(`sync_by_default`), and the database settings that keep a commit (`DurabilityReport`).

**Runs.** `sync_by_default(graph)` is a compiled graph whose runs are durable without
saying so.

The guard sends nothing unless the step that requested an effect is durably
checkpointed, so every run needs `durability="sync"`; forgetting it fails at the first
guarded call, after the model has already answered. LangGraph reads a run's default
durability from the graph's config when a run passes none, so the graph can carry it:

    graph = sync_by_default(builder.compile(checkpointer=saver))
    graph.invoke(inputs, config)            # durability="sync"
    graph.invoke(inputs, config, durability="async")   # still refused by the guard

LangGraph gives no hook that runs before the first node, so a run that does ask for
another durability still learns it at its first guarded call (nothing sent).

**Settings.** Exactly once rests on one fact: an intent (and a decision, and a receipt
only a human could rebuild) is on disk before the effect is sent. The savers enforce
what they can: SQLite connections run at `synchronous=FULL`, and every PostgreSQL ledger
write commits with `synchronous_commit` at least `on`, whatever the server, role or
session set. What they cannot enforce, `saver.durability()` (`await
saver.adurability()` on an async saver; `graph-durable durability` from a shell)
reports, each setting with what it risks: PostgreSQL's `fsync` and `full_page_writes`,
the session's `synchronous_commit`, `synchronous_standby_names` and each standby's
`sync_state` (a failover to an asynchronous standby can lose the last intents, and a
blind effect may then be sent again); SQLite's journal mode, `synchronous`, and a
database file on a network filesystem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from graph_durable._langgraph import CONFIG_KEY_DURABILITY

__all__ = ["DurabilityReport", "DurabilitySetting", "Level", "postgres_durability",
           "sqlite_durability", "sync_by_default"]

Level = Literal["ok", "enforced", "risk", "unknown"]
"""How a setting stands: `ok`; `enforced` (weaker than the guarantee needs, but the savers
override it for every ledger write); `risk` (a crash, a power cut or a failover can lose
intents, or writes stall); `unknown` (the database did not say)."""

G = TypeVar("G")


def sync_by_default(graph: G) -> G:
    """A copy of the compiled `graph` whose runs default to `durability="sync"`.

    The copy is the same kind of object (a compiled `Pregel`): `get_state`, streaming,
    subgraphs and `review` work on it as on the original. Runs that pass `durability=`
    keep what they pass.
    """
    with_config: Any = getattr(graph, "with_config", None)
    if with_config is None:
        raise TypeError(f"sync_by_default takes a compiled graph, got {type(graph).__name__}")
    return with_config(configurable={CONFIG_KEY_DURABILITY: "sync"})  # type: ignore[no-any-return]


@dataclass(frozen=True)
class DurabilitySetting:
    """One setting the guarantee rests on, as the database reported it."""

    name: str
    """The setting (`fsync`, `synchronous_commit`, `standby replica1`, `journal_mode`...)."""
    value: str
    """Its value, as the database reported it."""
    level: Level
    """How it stands (see `Level`)."""
    meaning: str
    """What it means for the guarantee, in one sentence."""


@dataclass(frozen=True)
class DurabilityReport:
    """The settings a database's commits depend on, and what each risks
    (`saver.durability()`)."""

    engine: Literal["sqlite", "postgresql"]
    """The database engine."""
    database: str
    """Which database: the SQLite file, or PostgreSQL's database name and server."""
    settings: tuple[DurabilitySetting, ...]
    """Every setting read, in the order of the docs' table."""

    @property
    def risks(self) -> tuple[DurabilitySetting, ...]:
        """The settings under which a crash, power cut or failover can lose an intent."""
        return tuple(setting for setting in self.settings if setting.level == "risk")

    @property
    def ok(self) -> bool:
        """Whether nothing was found at risk."""
        return not self.risks

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values."""
        return {"engine": self.engine, "database": self.database, "ok": self.ok,
                "settings": [{"name": s.name, "value": s.value, "level": s.level,
                              "meaning": s.meaning} for s in self.settings]}

    def summary(self) -> str:
        """The report as lines a person reads."""
        verdict = ("nothing found at risk" if self.ok
                   else f"{len(self.risks)} setting(s) at risk")
        lines = [f"{self.engine} {self.database}: {verdict}"]
        lines += [f"  [{s.level}] {s.name} = {s.value}: {s.meaning}" for s in self.settings]
        return "\n".join(lines)


_LOST_INTENT = "a blind effect may be sent again"
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs", "lustre",
    "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone", "fuse.glusterfs",
})
"""File systems whose locks or `fsync` SQLite cannot rely on."""
_SQLITE_SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def sqlite_durability(path: str, journal_mode: str, synchronous: int,
                      filesystem: str | None) -> DurabilityReport:
    """The report on a SQLite database at `path` (`""` for a database in memory or a
    temporary one), read on a saver's connection: its `journal_mode`, `synchronous`
    (0-3) and the type of the file system holding the file (`None` if not found)."""
    if not path:
        return DurabilityReport("sqlite", ":memory:", (DurabilitySetting(
            "file", "(in memory)", "risk",
            f"the ledger ends with the process: {_LOST_INTENT} after a restart"),))
    mode = journal_mode.lower()
    sync = _SQLITE_SYNCHRONOUS.get(synchronous, str(synchronous))
    settings = [
        DurabilitySetting("journal_mode", mode, "ok" if mode in (
            "wal", "delete", "truncate", "persist") else "risk",
            "a crash mid-write leaves the database whole" if mode in (
                "wal", "delete", "truncate", "persist") else
            f"a crash mid-write can corrupt the ledger: {_LOST_INTENT}; use WAL"),
        DurabilitySetting("synchronous", sync, "ok" if synchronous >= 2 else "enforced",
                          "each commit is on disk before it returns" if synchronous >= 2 else
                          "the saver sets FULL on its own connection before its first write"),
    ]
    if filesystem is None:
        settings.append(DurabilitySetting("filesystem", "(not found)", "unknown",
                                          "the file system holding the file was not found"))
    else:
        network = filesystem in NETWORK_FILESYSTEMS
        settings.append(DurabilitySetting(
            "filesystem", filesystem, "risk" if network else "ok",
            f"SQLite's locks and fsync are not reliable on a network file system: two "
            f"workers can both claim one call, and {_LOST_INTENT}; use a local disk, or "
            "PostgreSQL for workers on several machines" if network else "a local file system"))
    return DurabilityReport("sqlite", path, tuple(settings))


def _on_off(name: str, value: str, meaning_off: str) -> DurabilitySetting:
    on = value == "on"
    return DurabilitySetting(name, value, "ok" if on else "risk",
                             "on, as the guarantee needs" if on else meaning_off)


def postgres_durability(database: str, settings: dict[str, str], in_recovery: bool,
                        standbys: list[tuple[str, str | None]]) -> DurabilityReport:
    """The report on a PostgreSQL database, from what a saver's session read: `settings`
    (`fsync`, `full_page_writes`, `synchronous_commit`, `synchronous_standby_names`),
    whether the server is a standby itself, and each connected standby as
    `(application_name, sync_state)` (`sync_state` is `None` when the role may not read
    it: it needs `pg_read_all_stats`)."""
    commit = settings["synchronous_commit"]
    names = settings["synchronous_standby_names"]
    report = [
        _on_off("fsync", settings["fsync"],
                f"a power cut or an OS crash can lose or corrupt committed intents: "
                f"{_LOST_INTENT}"),
        _on_off("full_page_writes", settings["full_page_writes"],
                f"a power cut can tear a page of the ledger: {_LOST_INTENT}"),
        DurabilitySetting(
            "synchronous_commit", commit,
            "ok" if commit in ("on", "remote_apply") else "enforced",
            "every commit waits for the disk" + (" and the synchronous standbys"
                                                 if names else "")
            if commit in ("on", "remote_apply") else
            "every ledger write is committed at 'on' by the savers; checkpoints keep "
            f"'{commit}', so a crash may lose the last checkpoints, never an intent"),
    ]
    if in_recovery:
        report.append(DurabilitySetting(
            "role", "standby", "risk",
            "this server is a standby in recovery: it refuses every write until promoted"))
    synchronous = [name for name, state in standbys if state in ("sync", "quorum")]
    report.append(DurabilitySetting(
        "synchronous_standby_names", names or "(empty)",
        "ok" if not names or synchronous else "risk",
        "no synchronous standby is asked for: the ledger is as safe as this server's "
        "disk and its backups" if not names else
        f"ledger commits wait for {', '.join(synchronous)}" if synchronous else
        "no synchronous standby is connected: every ledger write waits until one is"))
    for name, state in standbys:
        if state is None:
            report.append(DurabilitySetting(
                f"standby {name}", "(hidden)", "unknown",
                "its sync_state needs pg_read_all_stats (or a superuser) to read"))
        elif state in ("sync", "quorum"):
            report.append(DurabilitySetting(
                f"standby {name}", state, "ok",
                "each ledger commit is on this standby before it returns"))
        else:
            report.append(DurabilitySetting(
                f"standby {name}", state, "risk",
                "a failover to this asynchronous standby can lose the last intents: "
                f"{_LOST_INTENT}"))
    return DurabilityReport("postgresql", database, tuple(report))
