"""``bench`` as a Django app for its management commands only: ``manage.py bench``,
``bench_fanout`` and ``latency_probe`` (docs/PERFORMANCE.md).

Django finds management commands only in installed apps, so ``config/settings.py`` lists this one.
It has no models, no migrations, no admin, no URLs and no ``ready()`` hook: loading it imports this
module and nothing else. The benchmark imports the apps; no app imports ``bench``.
"""

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"
    verbose_name = "Benchmark tools"
