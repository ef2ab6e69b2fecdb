"""A small saga for the admin API tests: two compensable steps and an optional signal."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field

from saga_engine import RetryPolicy, Saga, SagaContext, Signal, query, update

#: Compensations give up quickly here, so a stuck one is reached in a few virtual seconds.
QUICK = RetryPolicy(
    max_attempts=2, initial_backoff=timedelta(seconds=1), max_backoff=timedelta(seconds=1)
)


class TransferIn(BaseModel):
    account: str = Field(min_length=1, max_length=50)
    amount: int = Field(gt=0, le=1_000_000)
    wait_for_approval: bool = False


class TransferOut(BaseModel):
    ok: bool
    approved_by: str = ""


class Debit(BaseModel):
    account: str
    amount: int


class Refund(BaseModel):
    account: str
    amount: int


class Credit(BaseModel):
    account: str
    amount: int


class Uncredit(BaseModel):
    account: str
    amount: int


class Approve(BaseModel):
    by: str


class Note(BaseModel):
    """A signal the saga accepts but never waits for (it is buffered)."""

    text: str = ""


class Transfer(Saga[TransferIn, TransferOut]):
    name = "transfer"
    search_attributes = ("account",)
    approve = Signal(Approve)
    other = Signal(Note)

    @update(Note)
    def annotate(self, note: Note) -> str:
        """An update (the auth matrix calls it): echoes the note."""
        return note.text

    @query
    def kind(self) -> str:
        """A query (the auth matrix asks it)."""
        return self.name

    async def run(self, ctx: SagaContext, t: TransferIn) -> TransferOut:
        await ctx.step(
            "debit",
            to="ledger",
            command=Debit(account=t.account, amount=t.amount),
            compensate=Refund(account=t.account, amount=t.amount),
            compensate_retry=QUICK,
        )
        await ctx.step(
            "credit",
            to="payee",
            command=Credit(account=t.account, amount=t.amount),
            compensate=Uncredit(account=t.account, amount=t.amount),
            compensate_retry=QUICK,
        )
        by = ""
        if t.wait_for_approval:
            by = (await ctx.wait_signal(self.approve)).by
        return TransferOut(ok=True, approved_by=by)


class Ping(BaseModel):
    pass


class Noop(Saga[Ping, Ping]):
    name = "noop"

    async def run(self, ctx: SagaContext, p: Ping) -> Ping:
        return p


# A family of child sagas, for lineage: root -> middle -> leaf a, leaf b.


class Empty(BaseModel):
    pass


class Leaf(Saga[Empty, Empty]):
    name = "leaf"

    async def run(self, ctx: SagaContext, input: Empty) -> Empty:
        return Empty()


class Middle(Saga[Empty, Empty]):
    name = "middle"

    async def run(self, ctx: SagaContext, input: Empty) -> Empty:
        await ctx.child(Leaf, Empty(), id="a")
        await ctx.child(Leaf, Empty(), id="b")
        return Empty()


class Root(Saga[Empty, Empty]):
    name = "root"

    async def run(self, ctx: SagaContext, input: Empty) -> Empty:
        await ctx.child(Middle, Empty())
        return Empty()
