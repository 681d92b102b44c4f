"""Quota decisions without I/O (broker/quota_sensor.py): Kafka's entity precedence, the
windowed rate and the throttle time, over a fake clock."""

from kafscale.broker.quota_sensor import Rate, quota_entity, throttle_ms

U, C = "user", "client-id"


def q(*pairs, **values):
    return {tuple(sorted(pairs)): values}


def test_precedence_most_specific_first():
    quotas = {}
    for entity, rate in (
        (((C, None),), 8), (((C, "app"),), 7), (((U, None),), 6), (((U, None), (C, None)), 5),
        (((U, None), (C, "app")), 4), (((U, "alice"),), 3), (((U, "alice"), (C, None)), 2), (((U, "alice"), (C, "app")), 1),
    ):
        quotas.update(q(*entity, producer_byte_rate=float(rate)))
    order = []
    while quotas:
        found = quota_entity(quotas, "producer_byte_rate", "alice", "app")
        order.append(found[1])
        del quotas[found[0]]
    assert order == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]


def test_no_user_uses_client_id_levels_only_and_keys_are_separate():
    quotas = {**q((U, None), producer_byte_rate=1.0), **q((C, None), consumer_byte_rate=9.0)}
    assert quota_entity(quotas, "producer_byte_rate", None, "app") is None
    assert quota_entity(quotas, "consumer_byte_rate", None, "app") == (((C, None),), 9.0)
    assert quota_entity(quotas, "producer_byte_rate", "bob", "app") == (((U, None),), 1.0)


def test_rate_counts_at_least_ten_windows_and_expires_old_samples():
    r = Rate()
    r.record(10_000, 0)
    assert r.window_size_ms(500) == 10_500 and round(r.per_second(500)) == 952  # 10 kB over 10.5 s
    assert r.per_second(11_000) == 0  # the sample is out of the 11 windows


def test_throttle_time_brings_the_rate_back_to_the_bound():
    r = Rate()
    now = 0
    for _ in range(120):  # 2 MB/s for 12 s against a 1 MB/s quota
        r.record(200_000, now)
        now += 100
    t = throttle_ms(r, 1_000_000, now)
    assert t > 0
    # after waiting t ms with nothing sent, the measured rate is back at (or under) the bound
    assert r.per_second(now + t) <= 1_000_000 * 1.01
    assert throttle_ms(Rate(), 1_000_000, 0) == 0
