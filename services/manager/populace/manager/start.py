"""The start form: choose a simulation, paste or load a scenario YAML (or fill the parameter
form), validate it as `populace validate` does (populace.manager.scenarios), submit it.

    GET  /start, POST /start
"""

from __future__ import annotations

import asyncio

import nats.errors
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from populace.client.run import new_run_id, submit
from populace.manager import scenarios
from populace.manager.web import back, forbidden, nc_of, page, read_form, same_origin


async def start_page(request: Request) -> Response:
    if request.query_params.get("mode") == "form":
        chosen = request.query_params.get("simulation") or scenarios.DEFAULT_SIMULATION
        return page(request, "params.html", **scenarios.param_form_context(chosen))
    return page(request, "start.html", **scenarios.form_context())


async def start_submit(request: Request) -> Response:
    if not same_origin(request):
        return forbidden()
    form = await read_form(request)
    simulation = form.get("simulation", "")
    if form.get("mode") == "form":
        simulation = simulation or scenarios.DEFAULT_SIMULATION
        _, checked = await asyncio.to_thread(scenarios.validate_form, form, simulation)
        if checked.errors:
            return page(request, "params.html", status_code=422,
                        **scenarios.param_form_context(simulation, form, checked.errors))
    else:
        text = form.get("scenario", "")
        checked = await asyncio.to_thread(scenarios.validate, text, simulation)
        if checked.errors:
            return page(request, "start.html", status_code=422,
                        **scenarios.form_context(text, simulation, checked.errors))
    rid = new_run_id()
    p = checked.prepared
    try:
        await submit(nc_of(request), p.config, run_id=rid, personas=p.personas, graph=p.graph_blobs,
                     manifest=p.manifest)
    except (nats.errors.Error, TimeoutError, OSError) as err:  # the bus, not the scenario
        return back("/start", error=f"run {rid} was not submitted: the bus refused or did not answer "
                                    f"({type(err).__name__}: {err}); nothing was started")
    return back(f"/runs/{rid}", msg=f"run {rid} submitted: {p.config.simulation}, "
                                    f"{p.config.agents:,} agents × {p.config.rounds} rounds")


routes = [Route("/start", start_page), Route("/start", start_submit, methods=["POST"])]
