"""The ``saga`` command line."""

from __future__ import annotations

import typer

import saga_engine

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Operate saga-engine.")


@app.callback()
def _root() -> None:
    """saga-engine: durable sagas over Postgres and Kafka."""


@app.command()
def version() -> None:
    """Print the installed version."""
    typer.echo(saga_engine.__version__)


def main() -> None:
    app()
