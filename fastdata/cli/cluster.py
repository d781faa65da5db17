"""The options every whole-dataset command takes to run on a cluster:
``--scheduler`` (Dask) and ``--ray`` (Ray), the same as the Python keywords
``scheduler=`` and ``ray=``."""

from __future__ import annotations

import click

from fastdata.jobs.executor import RAY_ENV

#: The names of the options, for a command's --help sections.
CLUSTER_OPTIONS = ("scheduler", "ray")


def cluster_options(fn):
    """Add ``--scheduler`` and ``--ray`` to a command."""
    fn = click.option(
        "--ray", metavar="ADDRESS", default=None,
        help="Run on a Ray cluster: the address of its head (HOST:6379, ray://HOST:10001, "
             f"or auto for the one 'ray start' runs here; default: ${RAY_ENV}). Needs "
             "the ray extra (pip install -e '.[ray]'). As with --scheduler, the workers must "
             "see the files at the same paths, and the result is the same.")(fn)
    return click.option(
        "--scheduler", metavar="ADDRESS", default=None,
        help="Run on a Dask cluster: the address of its scheduler (tcp://HOST:8786; "
             "start one with 'dask scheduler' and workers with 'dask worker ADDRESS'). "
             "Every worker must see the files the job reads and writes at the same paths "
             "as this machine (a shared file system; a URL output stages in "
             "$FASTDATA_STAGING_DIR), and have fastdata installed. The result is the "
             "same, byte for byte, as on this machine. A worker that dies has its work "
             "redone; if the cluster goes, the finished pieces are kept and --resume "
             "continues (on the cluster or not).")(fn)


def job_options(fn):
    """Add the options of a whole-dataset job: ``--workers``, ``--resume``,
    ``--scheduler`` and ``--ray`` (``workers=``, ``resume=``, ``scheduler=``,
    ``ray=`` in Python)."""
    fn = cluster_options(fn)
    fn = click.option(
        "--resume", is_flag=True,
        help="Continue the interrupted run of this same command (a lost cluster, Ctrl-C, "
             "a crash): the pieces it finished are kept in its work folder (in "
             "$FASTDATA_STAGING_DIR, else the temporary folder), the rest run, and the "
             "result is an uninterrupted run's.")(fn)
    return click.option(
        "--workers", type=click.IntRange(min=1), default=None, metavar="N",
        help="Processes on this machine [default: usable cores]. Any N gives the same "
             "result.")(fn)
