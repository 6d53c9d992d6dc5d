"""The LLM agent: a Proposer that asks a model behind any OpenAI-compatible endpoint for the next
kernel. prompt.py builds the messages, llm.py sends them, kernel_source.py takes the kernel out of
the reply; modelnew_agent.py asks the same way for a KernelBench ModelNew.
"""
from __future__ import annotations

from typing import Callable

from autokernel.search import prompt
from autokernel.search.kernel_source import description_of, extract_last_python_block
from autokernel.search.proposer import Candidate, SearchContext


class LLMProposer:
    """Asks an LLM for the next kernel: prompt.py builds the messages, llm.py sends them,
    kernel_source.py takes the last python block of the reply."""

    name = "llm"

    def __init__(self, client, messages_for: Callable[[SearchContext], list[dict]] | None = None) -> None:
        self.client = client  # an autokernel.search.llm.LLMClient (or anything with its query())
        # what to ask: prompt.build_messages by default; another task (KernelBench) passes its own
        self.messages_for = messages_for

    def propose(self, ctx: SearchContext) -> Candidate:
        messages = (self.messages_for or prompt.build_messages)(ctx)
        reply = self.client.query(messages)
        source = extract_last_python_block(reply.text)
        description = description_of(reply.text) or ("LLM proposal" if source else "reply without a kernel")
        return Candidate(source=source, description=description, prompt=prompt.render(messages),
                         response=reply.text, prompt_tokens=reply.prompt_tokens,
                         completion_tokens=reply.completion_tokens, llm_seconds=reply.seconds)

    def observe(self, candidate: Candidate, verdict: dict | None) -> None:
        pass  # the next prompt reads the history from the context
