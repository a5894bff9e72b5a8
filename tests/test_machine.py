"""engine.machine: physical cores from /proc/cpuinfo text, and the automatic thread count."""

from engine.machine import _linux_physical_cores, default_threads, memory_bytes, physical_cores

HT = "".join(f"processor\t: {i}\nphysical id\t: 0\ncore id\t\t: {i // 2}\n\n" for i in range(4))
TWO_SOCKETS = "".join(f"processor\t: {i}\nphysical id\t: {i // 2}\ncore id\t\t: {i % 2}\n\n" for i in range(4))


def test_physical_cores_count_distinct_socket_and_core_pairs():
    assert _linux_physical_cores(HT) == 2  # 4 logical CPUs, two per core
    assert _linux_physical_cores(TWO_SOCKETS) == 4  # core ids repeat across sockets
    assert _linux_physical_cores("processor\t: 0\n") == 0  # unknown: the caller uses the logical count


def test_the_automatic_thread_count_leaves_a_core_free_and_memory_is_known():
    assert default_threads() == max(1, physical_cores() - 1) >= 1
    total, available = memory_bytes()
    assert total > 2**28 and 0 < available <= total
