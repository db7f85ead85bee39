from gpuaware.bench.pipeline_bench import lag_growing


def test_a_worker_that_starts_the_window_far_behind_and_falls_further_is_growing() -> None:
    # The 50,000-GPU run that read as flat: 67,600 -> 158,011 records over three minutes, sampled every 2 s.
    lags = [67_600 + i * 1_000 for i in range(91)]
    assert lag_growing(lags)


def test_a_steady_worker_whose_lag_jumps_by_a_take_is_not_growing() -> None:
    lags = [50.0, 520.0, 40.0, 610.0, 75.0, 480.0, 30.0, 700.0, 60.0]
    assert not lag_growing(lags)


def test_a_backlog_being_worked_off_is_not_growing() -> None:
    assert not lag_growing([float(x) for x in range(90_000, 0, -3_000)])


def test_a_lag_rising_from_nothing_is_growing_and_one_spike_is_not() -> None:
    assert lag_growing([float(i * 200) for i in range(30)])
    assert not lag_growing([100.0] * 14 + [50_000.0] + [100.0] * 15)


def test_too_few_samples_to_tell_are_not_growing() -> None:
    assert not lag_growing([]) and not lag_growing([10.0, 90_000.0])


def test_the_window_waits_for_the_meeting_backlog_to_be_worked_off_and_says_when_it_was_not(monkeypatch) -> None:
    import asyncio

    from gpuaware.bench import pipeline_bench

    lags = iter([40_000.0, None, 9_000.0, 800.0, 10.0])
    monkeypatch.setattr(pipeline_bench, "_lag", lambda procs: next(lags))
    real_sleep = asyncio.sleep
    monkeypatch.setattr(pipeline_bench.asyncio, "sleep", lambda s: real_sleep(0))
    assert asyncio.run(pipeline_bench._catch_up([], 1_250.0)) is not None
    assert next(lags) == 10.0  # it stopped at the first lag within a second's records
    monkeypatch.setattr(pipeline_bench, "_lag", lambda procs: 40_000.0)
    monkeypatch.setattr(pipeline_bench, "CATCH_UP_TIMEOUT_S", 0.05)
    assert asyncio.run(pipeline_bench._catch_up([], 1_250.0)) is None
