"""Agents built by prebuilt frameworks, guarded by `EffectGuardMiddleware`: a deep agent
(`deepagents.create_deep_agent`), a supervisor over a worker (`langgraph-supervisor`)
and a swarm with a handoff (`langgraph-swarm`). Each makes one charge on provider
`payments` (`<provider_dir>/payments.sqlite`) in the mode given, so the crash kit
(`run_child`) can kill it right after the charge and resume it. Needs the `prebuilt`
extra.

The models are `RuleModel`s: each asks for its calls in order, one a turn, each until a
ToolMessage of that tool answers it, then says it is done. A rule, not a turn count:
in a supervisor or a swarm several agents share one conversation.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool

from graph_durable.nodes import EffectGuardMiddleware, current_effect
from graph_durable.policy import Effect
from graph_durable.testing.models import DeterministicChatModel
from graph_durable.testing.providers import FakeProvider, ProviderMode
from graph_durable.testing.savers import open_saver
from graph_durable.testing.scenarios.effects import EffectsAgent

__all__ = ["RuleModel", "build_deep_agent", "build_supervisor", "build_swarm"]

Framework = Literal["deepagents", "supervisor", "swarm"]
CHARGE = {"name": "charge", "args": {"customer": "ana", "cents": 500}}


class RuleModel(DeterministicChatModel):
    """Asks for `calls` in order, one a turn, each until a ToolMessage of its tool is in
    the conversation; then answers `done`."""

    calls: list[dict[str, Any]]
    """The calls (`name`, `args`), in order."""
    done: str = "Done."
    """The final answer."""
    label: str = "model"
    """Names its messages' ids (`<label>-<tool>`), the same in every process."""

    @property
    def _llm_type(self) -> str:
        return "rule"

    def answer(self, messages: list[BaseMessage]) -> AIMessage:
        answered = {m.name for m in messages if isinstance(m, ToolMessage)}
        for call in self.calls:
            if call["name"] not in answered:
                call_id = f"{self.label}-{call['name']}"
                return AIMessage(content="", id=f"msg-{call_id}", tool_calls=[
                    {"name": call["name"], "args": call["args"], "id": call_id}])
        return AIMessage(content=self.done, id=f"msg-{self.label}-done")


def _policy(payments: FakeProvider, approval: bool) -> Effect:
    if payments.mode == "dedupe":
        return Effect(idempotent=True, approval=approval)
    if payments.mode == "lookup":
        return Effect(lookup=payments.find, approval=approval)
    return Effect(approval=approval)


def _charge_tool(payments: FakeProvider) -> BaseTool:
    @tool
    def charge(customer: str, cents: int) -> dict[str, Any]:
        """Charge a customer, in cents."""
        return payments.apply(current_effect().key, {"customer": customer, "cents": cents})

    return charge


def _parts(provider_dir: str, mode: ProviderMode, approval: bool
           ) -> tuple[FakeProvider, BaseTool, EffectGuardMiddleware]:
    os.makedirs(provider_dir, exist_ok=True)
    payments = FakeProvider(os.path.join(provider_dir, "payments.sqlite"), mode, name="payments")
    guard = EffectGuardMiddleware({"charge": _policy(payments, approval)})
    return payments, _charge_tool(payments), guard


def _agent(graph: Any, saver: Any, payments: FakeProvider) -> EffectsAgent:
    return EffectsAgent(graph=graph, saver=saver, providers={"payments": payments},
                        inputs={"messages": [HumanMessage("Charge Ana 5 euros.")]})


def build_deep_agent(db_path: str, provider_dir: str, mode: ProviderMode = "dedupe",
                     approval: bool = False) -> EffectsAgent:
    """A deep agent that charges with its own `charge` tool. Its `general-purpose`
    subagent, which deepagents gives the main agent's tools but not its middleware, is
    given the guard in its spec."""
    from deepagents import create_deep_agent

    payments, charge, guard = _parts(provider_dir, mode, approval)
    saver = open_saver(None, db_path)
    general = {"name": "general-purpose", "description": "General-purpose agent.",
               "system_prompt": "You help with anything.", "tools": [charge],
               "middleware": [EffectGuardMiddleware({"charge": _policy(payments, approval)})],
               "model": RuleModel(calls=[], label="general")}
    graph = create_deep_agent(model=RuleModel(calls=[CHARGE], label="deep"), tools=[charge],
                              middleware=[guard], subagents=[general], checkpointer=saver)
    return _agent(graph, saver, payments)


def build_supervisor(db_path: str, provider_dir: str, mode: ProviderMode = "dedupe",
                     approval: bool = False) -> EffectsAgent:
    """A supervisor that hands the charge to its `billing` worker, a `create_agent` whose
    guard is its own middleware."""
    from langgraph_supervisor import create_supervisor

    payments, charge, guard = _parts(provider_dir, mode, approval)
    saver = open_saver(None, db_path)
    billing = create_agent(RuleModel(calls=[CHARGE], label="billing", done="Charged."),
                           tools=[charge], middleware=[guard], name="billing")
    supervisor = create_supervisor(
        [billing], model=RuleModel(calls=[{"name": "transfer_to_billing", "args": {}}],
                                   label="supervisor"),
        prompt="Hand payments to billing.")
    return _agent(supervisor.compile(checkpointer=saver), saver, payments)


def build_swarm(db_path: str, provider_dir: str, mode: ProviderMode = "dedupe",
                approval: bool = False) -> EffectsAgent:
    """A swarm: `triage` hands off to `billing` (a handoff tool, read-only for the
    guard), which charges under its guard."""
    from langgraph_swarm import create_handoff_tool, create_swarm

    payments, charge, guard = _parts(provider_dir, mode, approval)
    saver = open_saver(None, db_path)
    handoff = create_handoff_tool(agent_name="billing")
    triage = create_agent(RuleModel(calls=[{"name": handoff.name, "args": {}}], label="triage"),
                          tools=[handoff], name="triage")
    billing = create_agent(RuleModel(calls=[CHARGE], label="billing", done="Charged."),
                           tools=[charge], middleware=[guard], name="billing")
    swarm = create_swarm([triage, billing], default_active_agent="triage")
    return _agent(swarm.compile(checkpointer=saver), saver, payments)
