"""A partition's bytes published per hour (nsqd/hourly_bytes.py), hours closed by hand as
nsqd's clock closes them."""

from nsqpy.nsqd.hourly_bytes import HourlyBytes


def test_each_hour_gets_what_the_total_grew_by_within_it():
    hourly = HourlyBytes(hour=22, total=1000)
    assert hourly.current(1500)[22] == 500
    hourly.close_hours(23, 1500)
    hourly.close_hours(0, 1600)
    assert hourly.buckets[22:] == [500, 100]
    assert hourly.current(1650)[0] == 50
    hourly.close_hours(0, 1700)  # the same hour again: nothing closes
    assert hourly.buckets[0] == 0


def test_hours_a_sleeping_machine_skipped_get_nothing():
    hourly = HourlyBytes(hour=1, total=0)
    hourly.buckets = [7] * 24  # a day ago's
    hourly.close_hours(5, 10)
    assert hourly.buckets[1:6] == [10, 0, 0, 0, 7]
    assert hourly.current(12)[5] == 2
