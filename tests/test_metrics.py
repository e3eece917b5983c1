import requests


def test_metrics_show_budgets_and_pools_to_loopback(start_weir):
    weir = start_weir({"server": {"http": {"main_pool_size": 8}}})
    r = requests.get(weir.url("/metrics"))
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain")
    text = r.text
    assert 'weir_budget_in_flight{budget="client_outbound"} 0.0' in text
    assert 'weir_budget_capacity{budget="client_outbound"} 4.0' in text  # half of 8
    assert 'weir_pool_size{pool="main"} 8.0' in text
    assert 'weir_pool_greenlets{pool="main"}' in text
    assert 'weir_pool_size{pool="federation"} 8.0' in text
    assert "weir_cooldown_addresses 0.0" in text
    assert "# TYPE weir_cooldowns_started_total counter" in text
    assert "weir_cooldowns_started_total 0.0" in text
    assert 'weir_rate_limit_refusals_total{limiter="login"} 0.0' in text
    assert 'weir_budget_capacity{budget="key_resolution"} 16.0' in text
    # Every open connection is a file descriptor: the limit is on /metrics too.
    assert "process_open_fds" in text and "process_max_fds" in text


def test_metrics_refused_to_clients_outside_the_allowed_networks(start_weir):
    weir = start_weir({"server": {"http": {"trusted_proxies": ["127.0.0.0/8"]}}})
    # Through a trusted proxy, the client is the forwarded address, not the proxy.
    r = requests.get(weir.url("/metrics"), headers={"X-Forwarded-For": "198.51.100.7"})
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN")
    assert requests.get(weir.url("/metrics")).status_code == 200


def test_metrics_can_be_switched_off(start_weir):
    weir = start_weir({"metrics": {"enabled": False}})
    r = requests.get(weir.url("/metrics"))
    assert (r.status_code, r.json()["errcode"]) == (404, "M_UNRECOGNIZED")


def test_rate_limiter_refusals_are_counted_per_limiter(start_weir):
    weir = start_weir({"ratelimiting": {"login": {"max_requests": 1, "per_seconds": 600}}})
    body = {"type": "m.login.password", "user": "nobody", "password": "x"}
    statuses = [
        requests.post(weir.url("/_matrix/client/v3/login"), json=body).status_code for _ in range(3)
    ]
    assert statuses == [403, 429, 429]
    text = requests.get(weir.url("/metrics")).text
    assert 'weir_rate_limit_refusals_total{limiter="login"} 2.0' in text
    assert 'weir_rate_limit_refusals_total{limiter="registration"} 0.0' in text
