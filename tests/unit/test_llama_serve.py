"""The llama.cpp replica's process: its OpenMP threads wait asleep unless the user says otherwise
(the CPU it saves is measured in populace.replicas.llama_serve.passive_openmp's docstring)."""

from __future__ import annotations

from populace.replicas.llama_serve import passive_openmp


def test_openmp_threads_wait_passively_by_default():
    environ: dict[str, str] = {"PATH": "/usr/bin"}
    passive_openmp(environ)
    assert environ == {"PATH": "/usr/bin", "OMP_WAIT_POLICY": "PASSIVE"}


def test_a_wait_policy_the_user_set_is_kept():
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    passive_openmp(environ)
    assert environ == {"OMP_WAIT_POLICY": "ACTIVE"}
