"""Topic names and partitioning, shared by the engine, the participants and the client."""

from __future__ import annotations

from dataclasses import dataclass

from saga_engine.kernel._settings import KafkaSettings


@dataclass(frozen=True, slots=True)
class Topics:
    """``{prefix}.inbox`` carries replies, start requests, signals and cancels for the
    engines; ``{prefix}.cmd.{participant}`` carries each participant's commands;
    ``{prefix}.dlq`` receives what cannot be processed, with the reason in a header;
    ``{prefix}.progress`` carries participants' reports on the steps they handle (not
    durable: each admin process reads it from its end)."""

    prefix: str

    @classmethod
    def of(cls, kafka: KafkaSettings) -> Topics:
        return cls(kafka.topic_prefix)

    @property
    def inbox(self) -> str:
        return f"{self.prefix}.inbox"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}.dlq"

    @property
    def progress(self) -> str:
        return f"{self.prefix}.progress"

    def commands(self, participant: str) -> str:
        return f"{self.prefix}.cmd.{participant}"

    def participant_group(self, participant: str) -> str:
        return f"{self.prefix}.participant.{participant}"
