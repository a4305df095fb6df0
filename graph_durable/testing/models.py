"""`ScriptedChatModel`: a deterministic chat model for agents in tests, notebooks and demos.

It answers by turn: the n-th answer of the script is given when the conversation holds
n AI messages. Unlike an iterator-driven fake, a new process resuming a thread gets the
same answer the crashed one would have, which is what a crash test needs. Swap in a real
model (e.g. `init_chat_model("openai:gpt-4.1")`) without changing the graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

__all__ = ["ScriptedChatModel"]


class ScriptedChatModel(BaseChatModel):
    """Answers the n-th model call of a conversation with `script[n]`."""

    script: list[AIMessage]
    """One AIMessage per turn; the last one is repeated if the conversation goes on."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        turn = sum(1 for message in messages if isinstance(message, AIMessage))
        answer = self.script[min(turn, len(self.script) - 1)]
        return ChatResult(generations=[ChatGeneration(message=answer.model_copy(deep=True))])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        """Tools are ignored: the script already names the calls."""
        return self
