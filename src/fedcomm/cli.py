"""The ``fedcomm`` command: one verb per pipeline stage, plus config validation.

Every verb reads ``--params`` (default ``params.yaml``), validates the WHOLE file before doing
any work, and calls one library function of :mod:`fedcomm.experiment`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedcomm.config import ConfigError, Params, load_params

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
config_app = typer.Typer(no_args_is_help=True, help="Inspect and validate params files.")
app.add_typer(config_app, name="config")

ParamsOpt = Annotated[Path, typer.Option("--params", "-p", help="params YAML file")]


def _load(path: Path) -> Params:
    try:
        return load_params(path)
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None


@config_app.command("validate")
def config_validate(params: ParamsOpt = Path("params.yaml")) -> None:
    """Check a params file; exit 2 with every problem listed by key path if it is invalid."""
    p = _load(params)
    typer.echo(
        f"{params}: OK ({len(p.experiment.runs)} run(s) x {len(p.experiment.seeds)} seed(s), "
        f"dataset {p.data.dataset.name}, partition {p.partition.kind}, model {p.model.name})"
    )


@config_app.command("show")
def config_show(params: ParamsOpt = Path("params.yaml")) -> None:
    """Print the validated params with every default filled in (YAML)."""
    import yaml

    typer.echo(yaml.safe_dump(_load(params).model_dump(mode="json"), sort_keys=False))


@app.command()
def partition(params: ParamsOpt = Path("params.yaml")) -> None:
    """Partition the dataset over clients (writes data/partition/)."""
    from fedcomm.experiment import partition_stage

    typer.echo(f"partition {partition_stage(_load(params))[:12]}")


@app.command()
def train(
    run: Annotated[str, typer.Option(help="key of `algorithms` to train")],
    seed: Annotated[int, typer.Option(help="seed (one of train.seeds or any)")] = 0,
    params: ParamsOpt = Path("params.yaml"),
    resume: Annotated[bool, typer.Option(help="continue from a matching checkpoint")] = True,
) -> None:
    """Train one algorithm run with one seed (writes runs/<run>-s<seed>/)."""
    from fedcomm.experiment import train_stage

    p = _load(params)
    p.algorithm(run)
    typer.echo(f"wrote {train_stage(p, run, seed, resume=resume)}")


@app.command("evaluate")
def evaluate_cmd(
    run: Annotated[str, typer.Option(help="key of `algorithms`")],
    seed: Annotated[int, typer.Option()] = 0,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Summaries and per-client evaluation of a trained run (runs/<run>-s<seed>/metrics.json)."""
    from fedcomm.experiment import evaluate_stage

    s = evaluate_stage(_load(params), run, seed)
    typer.echo(f"final global accuracy {s['final'].get('global/accuracy')}")


@app.command()
def summarize(params: ParamsOpt = Path("params.yaml")) -> None:
    """Tables and plots over every run and seed (reports/)."""
    from fedcomm.summarize import summarize_stage

    for path in summarize_stage(_load(params)):
        typer.echo(f"wrote {path}")


if __name__ == "__main__":
    app()
