"""`ScriptedChatModel`: a deterministic chat model for agents in tests, notebooks and demos.

It answers by turn: the n-th answer of the script is given when the conversation holds
n AI messages. Unlike an iterator-driven fake, a new process resuming a thread gets the
same answer the crashed one would have, which is what a crash test needs. Swap in a real
model (e.g. `init_chat_model("openai:gpt-4.1")`) without changing the graph.

`DeterministicChatModel` is its base: a model whose answer is a function of the
conversation alone (`answer(messages)`), for fakes that answer by another rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

__all__ = ["DeterministicChatModel", "ScriptedChatModel"]


class DeterministicChatModel(BaseChatModel):
    """A chat model whose answer depends on the conversation alone: a process resuming a
    thread gets the answer the crashed one would have had. Subclasses write `answer`."""

    bound_tools: list[dict[str, Any]] = Field(default_factory=list)
    """The tools last bound (`bind_tools`), as the OpenAI-format schemas a real model
    would be sent: what the model is told it may call."""

    def answer(self, messages: list[BaseMessage]) -> AIMessage:
        """The answer to `messages` (a new message: the caller may keep it)."""
        raise NotImplementedError

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.answer(messages))])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> DeterministicChatModel:
        """The answers already name the calls; the tools' schemas are kept in
        `bound_tools`, as a real model would be sent them."""
        self.bound_tools[:] = [convert_to_openai_tool(tool) for tool in tools]
        return self


class ScriptedChatModel(DeterministicChatModel):
    """Answers the n-th model call of a conversation with `script[n]`."""

    script: list[AIMessage]
    """One AIMessage per turn; the last one is repeated if the conversation goes on."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def answer(self, messages: list[BaseMessage]) -> AIMessage:
        """`script[n]` (a copy), n the AI messages of the conversation so far."""
        turn = sum(1 for message in messages if isinstance(message, AIMessage))
        return self.script[min(turn, len(self.script) - 1)].model_copy(deep=True)
