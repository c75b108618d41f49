"""`python -m populace.replicas.llama_serve FD GGUF N_CTX N_THREADS ALIAS [KEY_VARIABLE]`:
llama-cpp-python's OpenAI-compatible server on an inherited, already bound socket; with
KEY_VARIABLE, it asks every request for the key that environment variable holds (Bearer), as a
provider does (the key is never on its command line, where `ps` shows it).

`python -m llama_cpp.server` only binds a --port of its own, which another process can take
between our picking it and the server binding it; the launcher binds the port first and hands
the socket over (as for the simulated replicas)."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import MutableMapping


def passive_openmp(environ: MutableMapping[str, str]) -> None:
    """llama.cpp's threads wait for work asleep, not spinning (OpenMP's OMP_WAIT_POLICY), unless the
    environment says otherwise. libgomp spins by default: on cores that other processes share, a
    spinning thread burns what the thread it waits for needs (SmolLM2, 2 threads, 12 chats at load
    10: 55.8 CPU-s and 130 s spinning, 31.7 CPU-s and 47 s passive; 1 thread: 31.6 CPU-s, 85 s)."""
    environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main(argv: list[str]) -> None:
    fd, gguf, n_ctx, n_threads, alias, *key_variable = argv
    passive_openmp(os.environ)  # before llama_cpp loads libgomp, which reads it once

    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    key = os.environ[key_variable[0]] if key_variable else None
    app = create_app(server_settings=ServerSettings(api_key=key),
                     model_settings=[ModelSettings(model=gguf, n_ctx=int(n_ctx), n_threads=int(n_threads),
                                                   model_alias=alias)])
    uvicorn.Server(uvicorn.Config(app)).run(sockets=[socket.socket(fileno=int(fd))])


if __name__ == "__main__":
    main(sys.argv[1:])
