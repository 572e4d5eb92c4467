"""A stand-in for a small model answering the two-step Manager (a FunctionModel's function): it
reads the prompts as the model would and answers each step from the test's rules."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse
from pydantic_ai.models.function import AgentInfo

from app.memory.learning import choosing, second_look, writing
from tests.fakes import decided

_ITEM = re.compile(
    r"^(\d+)\. (?:\[(?P<hint>[^\]]+)\] )?(?:\(answering \"[^\"]*\"\) )?(?P<text>.*)$"
)


@dataclass
class TwoStep:
    """Labels each sentence by the first `labels` key it contains ("nothing" otherwise); writes
    each chosen sentence as `write` makes it (the sentence itself by default), replacing the
    similar memory `replaces` names (by its text) if shown; records every prompt by step."""

    labels: dict[str, str] = field(default_factory=dict)
    write: Callable[[str], str] = lambda text: text
    replaces: dict[str, str] = field(default_factory=dict)
    missed: list[str] = field(default_factory=list)
    prompts: dict[str, list[str]] = field(default_factory=lambda: {"choose": [], "write": [],
                                                                   "look": []})  # fmt: skip

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        request = next(m for m in messages if isinstance(m, ModelRequest))
        prompt = str(request.parts[-1].content)  # type: ignore[union-attr]
        said = info.instructions or ""  # the step's instructions (and, for some modes, more)
        if said.startswith(choosing.INSTRUCTIONS.strip()):
            self.prompts["choose"].append(prompt)
            return decided(info, self._labels(prompt))
        if said.startswith(writing.INSTRUCTIONS.strip()):
            self.prompts["write"].append(prompt)
            return decided(info, self._written(prompt))
        assert said.startswith(second_look.INSTRUCTIONS.strip()), said
        self.prompts["look"].append(prompt)
        return decided(info, {"missed": self.missed})

    def _labels(self, prompt: str) -> dict[str, str]:
        answer = {}
        for line in prompt.splitlines()[1:]:
            match = _ITEM.match(line)
            assert match is not None, line
            text = match.group("text")
            answer[match.group(1)] = next(
                (label for key, label in self.labels.items() if key in text), "nothing"
            )
        return answer

    def _written(self, prompt: str) -> dict[str, Any]:
        items: list[tuple[str, str | None, str, str]] = []  # number, hint, text, similar
        for line in prompt.splitlines()[1:]:
            if line.startswith("   (similar memories: "):
                number, hint, text, _ = items[-1]
                items[-1] = (number, hint, text, line.strip()[len("(similar memories: ") : -1])
                continue
            match = _ITEM.match(line)
            assert match is not None, line
            items.append((match.group(1), match.group("hint"), match.group("text"), ""))
        answer: dict[str, Any] = {}
        for number, hint, text, similar in items:
            letters = {m.group(2): m.group(1)
                       for m in re.finditer(r"([a-h])\. (.*?)(?=; [a-h]\. |$)", similar)}  # fmt: skip
            target = next((letters[v] for k, v in self.replaces.items() if k in text
                           and v in letters), "none")  # fmt: skip
            if hint == "a request to forget":
                answer[number] = {"forget": target}
            else:
                item: dict[str, Any] = {"memory": self.write(text)}
                if similar:
                    item["replaces"] = target
                answer[number] = item
        return answer
