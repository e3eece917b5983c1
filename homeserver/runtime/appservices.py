"""The application services' components (homeserver/appservice/), built for
HomeserverRuntime: their registrations, read again from the files app.py checked at start."""

from __future__ import annotations

from typing import TYPE_CHECKING

from homeserver.appservice.client import AppserviceClient
from homeserver.appservice.registration import load_registrations
from homeserver.appservice.sender import AppserviceSender
from homeserver.appservice.service import QUERIES_AT_ONCE, AppserviceService
from homeserver.storage.appservice import APPSERVICES, AppserviceStore

if TYPE_CHECKING:
    from homeserver.runtime import HomeserverRuntime


def build_appservices(rt: HomeserverRuntime) -> AppserviceService:
    registrations = load_registrations(rt.config.app_service_config_files, rt.server_name)
    # Queries and pings: a few at once per appservice, apart from the transactions' pool.
    client = AppserviceClient(rt.config.appservice.deadline, pool_size=QUERIES_AT_ONCE + 1)
    service = AppserviceService(
        registrations,
        rt.accounts,
        rt.rooms,
        rt.directory.store,
        client,
        rt.server_name,
        on_request=lambda appservice_id: rt.appservice_sender.on_request_from(appservice_id),
    )
    for registration in registrations:
        service.ensure_sender(registration)
    return service


def build_appservice_sender(rt: HomeserverRuntime) -> AppserviceSender:
    settings = rt.config.appservice
    sender = AppserviceSender(
        rt.appservices.registrations,
        AppserviceStore(rt.db),
        AppserviceClient(settings.deadline),
        rt.appservices.interest,
        settings.max_in_flight,
        leases=rt.queue_leases("appservice", APPSERVICES, settings.deadline),
    )
    rt.metrics.track_gauge(
        "weir_appservice_in_flight",
        "Transactions to application services in flight",
        lambda: sender.in_flight,
    )
    rt.metrics.track_gauge(
        "weir_appservice_backoff",
        "Application services backing off after a failed transaction",
        sender.backing_off,
    )
    return sender
