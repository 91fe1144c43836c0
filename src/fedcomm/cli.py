# ruff: noqa: E402 (SIGINT is handled before the imports, which take seconds)
"""The ``fedcomm`` command: one verb per pipeline stage, plus config validation.

Every verb reads ``--params`` (default ``params.yaml``), validates the WHOLE file before doing
any work, and calls one library function of :mod:`fedcomm.stages` (one module per stage).

Ctrl-C (SIGINT) ends every verb with ONE line on stderr that starts ``interrupted`` and says
what a rerun of the same command does, exit status 130, and no traceback: while the command
starts (its imports take seconds) it exits at once; in a verb, a Ctrl-C stops it (writes in
progress finished whole, the MLflow run marked ``KILLED``), and once it is caught later ones are
ignored while the verb cleans up. ``train`` names the round it stopped at and the checkpoint it
keeps.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn, TypeVar

STARTING = "interrupted while starting; rerun the same command"


def _exit_while_starting(signum: int, frame: FrameType | None) -> None:
    """SIGINT before a verb runs: nothing done yet, nothing to clean up."""
    os.write(2, f"{STARTING}\n".encode())
    os._exit(130)


def _on_sigint(handler: Callable[[int, FrameType | None], Any] | signal.Handlers) -> Any:
    """Handle SIGINT with ``handler`` where Python handles it (the main thread; not where it is
    ignored, or handled outside Python); returns the handler before."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if previous not in (signal.SIG_IGN, None):
        signal.signal(signal.SIGINT, handler)
    return previous


_before_import = _on_sigint(_exit_while_starting)  # (restored at the end of this module)

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from fedcomm.config import ConfigError, Params, load_params
from fedcomm.errors import InputError, InputWarning, Interrupted, stop_on_interrupt, stopping
from fedcomm.evaluation.curve_points import LAST_K

Verb = TypeVar("Verb", bound=Callable[..., Any])
RERUN = {  # verb: what rerunning it does, after "rerun the same command"
    "partition": "to partition the dataset",
    "train": "to train the run",
    "evaluate_cmd": "to evaluate the run",
    "summarize": "to summarize the runs",
    "report": "to write the report",
    "verdicts": "to decide the claims",
    "curves": "to write the curves",
    "sweep": "to continue the study",
}


def _stop(line: str) -> NoReturn:
    typer.echo(line, err=True)
    raise typer.Exit(130)


def _interruptible(verb: Verb) -> Verb:
    """``verb`` ending on Ctrl-C with one ``interrupted`` line and exit status 130."""
    rerun = RERUN.get(verb.__name__)

    @functools.wraps(verb)
    def run(*args: Any, **kwargs: Any) -> Any:
        if signal.getsignal(signal.SIGINT) is _exit_while_starting:  # the command (not a test)
            _on_sigint(stop_on_interrupt)
        try:
            return verb(*args, **kwargs)
        except KeyboardInterrupt:
            stopping()
            _stop("interrupted; rerun the same command" + (f" {rerun}" if rerun else ""))

    return run  # type: ignore[return-value]


class _Typer(typer.Typer):
    """Every verb :func:`_interruptible`; run as the command, SIGINT exits at once until a verb
    starts and is ignored once it is done."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _on_sigint(_exit_while_starting)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            _on_sigint(signal.SIG_IGN)  # the interpreter's exit is not interrupted

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Verb], Verb]:
        register = super().command(*args, **kwargs)

        def decorator(verb: Verb) -> Verb:
            register(_interruptible(verb))
            return verb

        return decorator


app = _Typer(add_completion=False, no_args_is_help=True, help=__doc__)
config_app = _Typer(no_args_is_help=True, help="Inspect and validate params files.")
app.add_typer(config_app, name="config")
system_app = _Typer(no_args_is_help=True, help="Simulated-time inputs: device traces.")
app.add_typer(system_app, name="system")

ParamsOpt = Annotated[Path, typer.Option("--params", "-p", help="params YAML file")]


@contextmanager
def user_errors() -> Iterator[None]:
    """Bad input (params, damaged or missing files, impossible partitions) or a diverged run ->
    one clear message on stderr and exit status 2, instead of a traceback. Bugs still raise."""
    from fedcomm.simulation.divergence import DivergenceError

    try:
        yield
    except (InputError, DivergenceError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None


def _format_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    line: str | None = None,
) -> str:
    if issubclass(category, InputWarning):
        return f"warning: {message}\n"
    return _default_format(message, category, filename, lineno, line)


_default_format = warnings.formatwarning
warnings.formatwarning = _format_warning  # the command's own warnings: one line each


def _load(path: Path) -> Params:
    with user_errors():
        return load_params(path)


@config_app.command("validate")
def config_validate(
    params: ParamsOpt = Path("params.yaml"),
    schema_only: Annotated[
        bool, typer.Option("--schema-only", help="only the params' schema, not the data")
    ] = False,
) -> None:
    """Check a params file; exit 2 with every problem listed by key path if it is invalid.
    Unless --schema-only: also load the dataset, draw the partition in memory and check that
    every run's model fits the data and its algorithm accepts the model (nothing is written)."""
    from fedcomm.stages.train import check_experiment

    p = _load(params)
    clients = ""
    if not schema_only:
        with user_errors():
            clients = f", {check_experiment(p)} clients"
    typer.echo(
        f"{params}: OK ({len(p.experiment.runs)} run(s) x {len(p.experiment.seeds)} seed(s), "
        f"dataset {p.data.dataset.name}, partition {p.partition.kind}{clients}, "
        f"model {p.model.name})"
    )


@config_app.command("show")
def config_show(params: ParamsOpt = Path("params.yaml")) -> None:
    """Print the validated params with every default filled in (YAML)."""
    import yaml

    typer.echo(yaml.safe_dump(_load(params).model_dump(mode="json"), sort_keys=False))


@system_app.command("convert-fedscale")
def system_convert_fedscale(
    out: Annotated[Path, typer.Option(help="folder for clients.parquet / windows.parquet")],
    device: Annotated[
        Path | None, typer.Option(help="FedScale's client_device_capacity pickle")
    ] = None,
    behave: Annotated[Path | None, typer.Option(help="FedScale's client_behave_trace pickle")] = (
        None
    ),
) -> None:
    """Convert FedScale's device / behaviour pickles (either or both) into a client table and
    availability windows (docs/traces.md); the pickles' globals are refused, never run."""
    from fedcomm.system.fedscale import convert_fedscale

    with user_errors():
        written = convert_fedscale(device, behave, out)
    for path in written:
        typer.echo(f"wrote {path}")


@app.command()
def partition(params: ParamsOpt = Path("params.yaml")) -> None:
    """Partition the dataset over clients (writes data/partition/)."""
    from fedcomm.stages.partition import partition_stage

    p = _load(params)
    with user_errors():
        typer.echo(f"partition {partition_stage(p)[:12]}")


@app.command()
def train(
    run: Annotated[str, typer.Option(help="key of `algorithms` to train")],
    seed: Annotated[int, typer.Option(help="seed (usually one of experiment.seeds)")] = 0,
    params: ParamsOpt = Path("params.yaml"),
    resume: Annotated[bool, typer.Option(help="continue from a matching checkpoint")] = True,
    nproc: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="processes to train on (torchrun on this machine; default train.nproc): each "
            "round's clients split over them, the same numbers as one process",
        ),
    ] = None,
) -> None:
    """Train one algorithm run with one seed (writes runs/<run>-s<seed>/). Ctrl-C stops it with
    one line naming the round and the checkpoint kept; the same command resumes from there."""
    from fedcomm.simulation import shard
    from fedcomm.stages.train import train_stage

    p = _load(params)
    n, world = nproc if nproc is not None else p.train.nproc, shard.world_size()
    if world > 1 and nproc is not None and nproc != world:
        typer.echo(f"error: --nproc {nproc}, but torchrun started {world} processes", err=True)
        raise typer.Exit(2)
    if n > 1 and world == 1:  # this process starts torchrun, which runs this command n times
        resumed = "--resume" if resume else "--no-resume"
        args = ["train", "--run", run, "--seed", str(seed), "--params", str(params), resumed]
        raise typer.Exit(shard.torchrun(n, args))
    with user_errors():
        try:
            out = train_stage(p, run, seed, resume=resume)
        except Interrupted as err:  # once the checkpoint was read: what a rerun resumes from
            stopping()
            _stop(str(err))
    if shard.world_size() == 1 or os.environ.get("RANK") == "0":
        typer.echo(f"wrote {out}")


@app.command("evaluate")
def evaluate_cmd(
    run: Annotated[str, typer.Option(help="key of `algorithms`")],
    seed: Annotated[int, typer.Option()] = 0,
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Summaries and per-client evaluation of a trained run (runs/<run>-s<seed>/metrics.json)."""
    from fedcomm.stages.evaluate import evaluate_stage

    p = _load(params)
    with user_errors():
        s = evaluate_stage(p, run, seed)
    typer.echo(f"final global accuracy {s['final'].get('global/accuracy')}")


@app.command()
def summarize(params: ParamsOpt = Path("params.yaml")) -> None:
    """Tables and plots over every run and seed (reports/)."""
    from fedcomm.stages.summarize import summarize_stage

    p = _load(params)
    with user_errors():
        for path in summarize_stage(p):
            typer.echo(f"wrote {path}")


@app.command()
def report(
    experiment: Annotated[
        list[str] | None, typer.Option("--experiment", "-e", help="MLflow experiment (repeat)")
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(help="tag filter KEY=VALUE (repeat)")] = None,
    dvc_exp: Annotated[
        str | None, typer.Option(help="runs of one DVC experiment (tag dvc.exp_name)")
    ] = None,
    group_by: Annotated[str, typer.Option(help="tag whose value names a group")] = "run",
    target: Annotated[
        list[float] | None, typer.Option(help="accuracy target in (0, 1] for time-to-accuracy")
    ] = None,
    budget_gib: Annotated[
        list[float] | None, typer.Option(help="GiB budget: best accuracy within it (repeat)")
    ] = None,
    time_budget_h: Annotated[
        list[float] | None,
        typer.Option(help="simulated-hours budget (runs with `system`): best accuracy within it"),
    ] = None,
    metric: Annotated[str, typer.Option(help="global/accuracy or topk/accuracy")] = (
        "global/accuracy"
    ),
    uri: Annotated[str | None, typer.Option(help="tracking URI (default: the project's)")] = None,
    title: Annotated[str, typer.Option()] = "fedcomm comparison",
    out: Annotated[Path, typer.Option(help="output folder")] = Path("reports/compare"),
    last_k: Annotated[
        int,
        typer.Option(
            min=1, help="final accuracy = the mean of each run's last k evaluations (as last_k)"
        ),
    ] = LAST_K,
) -> None:
    """Compare MLflow runs per algorithm: mean ± SE over seeds, accuracy-vs-GiB overlays."""
    from fedcomm.reporting.compare import compare_runs

    with user_errors():
        tags: dict[str, str] = {}
        for item in tag or []:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"--tag {item!r}: expected KEY=VALUE")
            tags[key] = value
        written = compare_runs(
            uri,
            out,
            experiments=experiment or [],
            tags=tags,
            dvc_exp=dvc_exp,
            group_by=group_by,
            targets=target or [],
            budgets_gib=budget_gib or [],
            metric=metric,
            title=title,
            time_budgets_h=time_budget_h or [],
            last_k=last_k,
        )
    for path in written:
        typer.echo(f"wrote {path}")


@app.command()
def verdicts(
    claims: Annotated[
        Path, typer.Argument(help="claims registry (docs/reproductions/claims.yaml)")
    ],
    write: Annotated[
        list[Path] | None,
        typer.Option(help="fill this page's marker blocks (repeat for more pages)"),
    ] = None,
    check: Annotated[
        list[Path] | None,
        typer.Option(help="exit 1 with a diff if this page's blocks are stale (repeatable)"),
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the numbers here")] = None,
) -> None:
    """Decide every claim of a registry by the rule (paired t over seeds, protocol v2) and
    print the behaviours and checks tables; --write/--check keep pages' marked blocks in step
    (the reproductions README's tables, a paper page's or the project README's headline)."""
    from fedcomm import atomic
    from fedcomm.reporting.claims import decide, load_registry, verdicts_json
    from fedcomm.reporting.verdict_tables import blocks, diff, fill

    writes, checks = list(write or []), list(check or [])
    with user_errors():
        registry = load_registry(claims)
        decided = decide(registry)
        stale = []
        for page in [*writes, *checks]:
            if not page.is_file():
                raise InputError(f"{page}: no such file")
        for page in dict.fromkeys([*writes, *checks]):
            old = page.read_text(encoding="utf-8")
            new = fill(old, blocks(registry, decided, page.parent), page)
            if page in writes:
                if new != old:
                    atomic.write_text(page, new)
                    typer.echo(f"wrote {page}")
            elif new != old:
                stale.append((page, diff(old, new, page)))
        if json_out is not None:
            atomic.write_json(json_out, verdicts_json(registry, decided))
            typer.echo(f"wrote {json_out}")
    if not writes and not checks:
        shown = blocks(registry, decided, claims.parent)
        tables = ("verdicts", "diagnoses", "checks", "untested")
        typer.echo("\n\n".join(shown[k] for k in tables if shown.get(k)))
    if stale:
        for page, text in stale:
            typer.echo(text, nl=False)
            typer.echo(f"error: {page}: the verdict blocks are not what {claims} gives", err=True)
        raise typer.Exit(1)


@app.command()
def curves(
    build: Annotated[Path, typer.Option(help="a build folder (with runs/<run>-s<seed>/)")],
    out: Annotated[Path, typer.Option(help="the long curves CSV to write")],
) -> None:
    """The long curves table (run, seed, round, every numeric metric of the evaluation rounds)
    of every run and seed of a build whose train stage finished; the others are listed on
    stderr and skipped."""
    from fedcomm import atomic
    from fedcomm.reporting.curves import build_curves

    with user_errors():
        if not build.is_dir():
            raise InputError(f"--build {build}: no such folder")
        table, skipped = build_curves(build)
        for line in skipped:
            typer.echo(f"skipped {line}", err=True)
        if table.height == 0:
            raise InputError(f"--build {build}: no finished run (nothing written)")
        atomic.write_text(out, table.write_csv())
    runs = table.select("run", "seed").unique().height
    typer.echo(f"wrote {out} ({runs} finished run(s) x seed(s), {table.height} rows)")


@app.command()
def ui(
    uri: Annotated[str | None, typer.Option(help="tracking URI (default: the project's)")] = None,
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="port to listen on")] = 5000,
) -> None:
    """The MLflow UI on the project's store; prints the link to each experiment's runs."""
    from fedcomm.tracking.ui import serve

    with user_errors():
        status = serve(uri, host=host, port=port, echo=typer.echo)
    raise typer.Exit(status)


@app.command()
def sweep(
    space: Annotated[Path, typer.Argument(help="search-space YAML (pipeline/search_spaces/)")],
    trials: Annotated[
        int | None, typer.Option(help="finished trials to reach (default: the space's `trials`)")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="output folder (default reports/sweep/<study>)")
    ] = None,
    launcher: Annotated[
        str,
        typer.Option(
            help="local: trials in this process (start more workers to parallelise); "
            "submitit: each missing trial a job-array task (Slurm, or processes here)"
        ),
    ] = "local",
    cluster: Annotated[
        str | None,
        typer.Option(help="submitit: slurm, local or debug (default: slurm where sbatch exists)"),
    ] = None,
    parallel: Annotated[int, typer.Option(help="submitit: tasks running at once")] = 4,
    timeout_min: Annotated[int, typer.Option(help="submitit: a task's time limit, minutes")] = 60,
    partition: Annotated[str | None, typer.Option(help="submitit: Slurm partition")] = None,
    cpus_per_task: Annotated[int, typer.Option(help="submitit: CPUs a task")] = 1,
    gpus_per_task: Annotated[int, typer.Option(help="submitit: GPUs a task")] = 0,
    mem_gb: Annotated[float | None, typer.Option(help="submitit: memory a task, GB")] = None,
    slurm: Annotated[
        list[str] | None,
        typer.Option(help="submitit: any other Slurm setting as KEY=VALUE (e.g. account=lab)"),
    ] = None,
) -> None:
    """Run (or continue, or join as one more worker) an Optuna study over a search space."""
    from fedcomm.sweep.study import SweepFailed, run_sweep

    with user_errors():
        try:
            if launcher == "submitit":
                from fedcomm.sweep.launcher import Cluster, launch

                extra = dict(_key_value("--slurm", kv) for kv in slurm or [])
                where = Cluster(
                    cluster, None, parallel, timeout_min, partition, cpus_per_task,
                    gpus_per_task, mem_gb, extra,
                )  # fmt: skip
                result = launch(space, where, trials=trials, reports=out)
            elif launcher == "local":
                result = run_sweep(space, trials=trials, reports=out)
            else:
                raise InputError(f"--launcher: {launcher!r} is not one of ['local', 'submitit']")
        except SweepFailed as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(1) from None
    typer.echo(f"study {result.study}: {result.finished} finished, {result.failed} failed trial(s)")
    for path in result.outputs:
        typer.echo(f"wrote {path}")


def _key_value(option: str, text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise InputError(f"{option}: {text!r} is not KEY=VALUE")
    return key, value


@app.command("sweep-args")
def sweep_args(
    best: Annotated[Path, typer.Argument(help="a sweep's best_params.yaml")],
) -> None:
    """Print the `-S key=value` arguments that apply a sweep's best params:
    `dvc exp run $(fedcomm sweep-args reports/sweep/<study>/best_params.yaml)`."""
    import shlex

    import yaml

    from fedcomm.sweep.outputs import set_args

    with user_errors():
        if not best.is_file():
            raise ConfigError(f"{best}: no such file (run `fedcomm sweep` first)")
        doc = yaml.safe_load(best.read_text()) or {}
        if not isinstance(doc.get("params"), dict):
            raise ConfigError(f"{best}: no `params` mapping (not a sweep's best_params.yaml?)")
    args = set_args(doc["params"])
    if any(a != shlex.quote(a) for a in args):  # $(...) output is split on blanks, not quotes
        typer.echo(f"warning: values need quoting; copy the line in {best}", err=True)
    typer.echo(" ".join(f"-S {a}" for a in args))


if signal.getsignal(signal.SIGINT) is _exit_while_starting:  # imported: SIGINT as it was
    signal.signal(signal.SIGINT, _before_import)


def _main() -> None:
    """``python -m fedcomm.cli``: the ``fedcomm`` command. (CPython ends a ``-m`` program by
    SIGINT, whatever its exit status, once a KeyboardInterrupt has escaped code that a library
    ran through ``PyRun_*``, even one the command then handled; a ``PyRun_*`` that succeeds
    clears that, so an interrupt exits 130 here too, as from the console script.)"""
    try:
        app()
    except SystemExit:
        import ctypes

        ctypes.pythonapi.PyRun_SimpleString(b"")
        raise


if __name__ == "__main__":
    _main()
