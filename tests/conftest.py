"""Shared fixtures: the packaged paired encoder (loaded once per test session) and a small corpus."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# torch and faiss each bring an OpenMP runtime; with the default (spinning) wait policy the threads
# one of them leaves spinning after a call starve the other on a small machine -- on 2 cores, query
# encoding right after a FAISS search ran ~15x slower. Passive waiting removes that. Set before
# torch/faiss are imported (this file is imported first); child processes inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# haystack-ai sends anonymous usage telemetry by default; tests reach no network (and must not try)
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
# the onnx backend's graphs (built on first use) go to a folder of this session, not the user's cache
if "HYBRIDRET_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["HYBRIDRET_CACHE_DIR"] = _CACHE = tempfile.mkdtemp(prefix="hybridret-test-cache-")
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

SMALL_CORPUS: list[dict[str, str]] = [
    {"id": "d01", "title": "Photosynthesis",
     "text": "Plants use sunlight, water and carbon dioxide to make glucose and release oxygen."},
    {"id": "d02", "title": "The Eiffel Tower",
     "text": "The wrought-iron lattice tower in Paris was completed in 1889 for the World's Fair."},
    {"id": "d03", "title": "Python programming",
     "text": "Python is a high-level programming language known for readable code and dynamic typing."},
    {"id": "d04", "title": "Mount Everest",
     "text": "Everest is the highest mountain on Earth, rising 8,849 metres above sea level in the Himalayas."},
    {"id": "d05", "title": "Honey bees",
     "text": "Bees collect nectar from flowers and turn it into honey inside the hive."},
    {"id": "d06", "title": "The French Revolution",
     "text": "Beginning in 1789, the revolution overthrew the monarchy and reshaped French society."},
    {"id": "d07", "title": "Black holes",
     "text": "A black hole is a region of spacetime where gravity is so strong that not even light escapes."},
    {"id": "d08", "title": "Sourdough bread",
     "text": "Sourdough is leavened with a starter of wild yeast and lactic acid bacteria."},
    {"id": "d09", "title": "The human heart",
     "text": "The heart pumps blood through the circulatory system, beating about seventy times a minute."},
    {"id": "d10", "title": "Electric cars",
     "text": "Battery electric vehicles run on lithium-ion batteries and produce no tailpipe emissions."},
    {"id": "d11", "title": "Chess openings",
     "text": "The Sicilian Defence is a popular chess opening in which Black answers 1.e4 with c5."},
    {"id": "d12", "title": "Coral reefs",
     "text": "Coral reefs are built by colonies of tiny animals and are threatened by ocean warming."},
    {"id": "d13", "title": "The Great Wall of China",
     "text": "The Great Wall stretches thousands of kilometres across northern China."},
    {"id": "d14", "title": "Vaccines",
     "text": "Vaccines train the immune system to recognise a virus without causing the disease."},
    {"id": "d15", "title": "Jazz music",
     "text": "Jazz began in New Orleans and is known for improvisation, swing and blue notes."},
    {"id": "d16", "title": "Volcanoes",
     "text": "Volcanoes erupt when molten rock, called magma, rises through the Earth's crust."},
    {"id": "d17", "title": "The Moon landing",
     "text": "In July 1969 Apollo 11 astronauts Neil Armstrong and Buzz Aldrin walked on the Moon."},
    {"id": "d18", "title": "Coffee",
     "text": "Coffee is brewed from roasted beans and contains caffeine, a mild stimulant."},
    {"id": "d19", "title": "Machine learning",
     "text": "Machine learning algorithms learn patterns from data to make predictions."},
    {"id": "d20", "title": "The Amazon rainforest",
     "text": "The Amazon is the largest tropical rainforest and is home to millions of species."},
    {"id": "d21", "title": "Olympic Games",
     "text": "The modern Olympic Games were first held in Athens in 1896."},
    {"id": "d22", "title": "Tea ceremony",
     "text": "The Japanese tea ceremony is a ritual preparation of powdered green tea called matcha."},
    {"id": "d23", "title": "Earthquakes",
     "text": "Earthquakes happen when tectonic plates slip suddenly along a fault line."},
    {"id": "d24", "title": "Shakespeare",
     "text": "William Shakespeare wrote Hamlet, Macbeth and Romeo and Juliet."},
    {"id": "d25", "title": "Penguins",
     "text": "Penguins are flightless seabirds that live mostly in the Southern Hemisphere."},
    {"id": "d26", "title": "Bitcoin",
     "text": "Bitcoin is a decentralised digital currency secured by a blockchain ledger."},
    {"id": "d27", "title": "Recycling",
     "text": "Recycling turns waste paper, glass and plastic into new products."},
    {"id": "d28", "title": "The Roman Empire",
     "text": "At its height the Roman Empire ruled the lands around the Mediterranean Sea."},
    {"id": "d29", "title": "Yoga",
     "text": "Yoga combines breathing exercises, meditation and physical postures."},
    {"id": "d30", "title": "Solar panels",
     "text": "Photovoltaic solar panels convert sunlight directly into electricity."},
    {"id": "d31", "title": "Dinosaurs",
     "text": "Dinosaurs went extinct about 66 million years ago after an asteroid impact."},
    {"id": "d32", "title": "The piano",
     "text": "The piano is a keyboard instrument whose hammers strike steel strings."},
    {"id": "d33", "title": "Antibiotics",
     "text": "Penicillin, discovered by Alexander Fleming, was the first widely used antibiotic."},
    {"id": "d34", "title": "Football",
     "text": "Association football is played by two teams of eleven players with a round ball."},
    {"id": "d35", "title": "Glaciers",
     "text": "Glaciers are slow rivers of ice that carve valleys as they move."},
    {"id": "d36", "title": "The printing press",
     "text": "Johannes Gutenberg's printing press made books cheap in fifteenth-century Europe."},
    {"id": "d37", "title": "Sleep",
     "text": "Adults need seven to nine hours of sleep each night for good health."},
    {"id": "d38", "title": "Wolves",
     "text": "Grey wolves hunt in packs and communicate by howling."},
    {"id": "d39", "title": "Chocolate",
     "text": "Chocolate is made from fermented and roasted cacao seeds."},
    {"id": "d40", "title": "Tides",
     "text": "Ocean tides are caused mainly by the gravitational pull of the Moon."},
]


@pytest.fixture(scope="session")
def paired_encoder():
    """The packaged MiniLM + SPLADE-tiny pair, loaded once per session."""
    from hybridret.encoders import PairedEncoder

    return PairedEncoder.from_names()


@pytest.fixture(scope="session")
def small_corpus() -> list[dict[str, str]]:
    """~40 short, varied English documents as ``{"id", "title", "text"}`` dicts."""
    return [dict(d) for d in SMALL_CORPUS]


@pytest.fixture
def start_server():
    """Start ``hybridret serve DIR ARGS...`` on a free loopback port and wait until it answers;
    returns ``(process, url)``. A server that exits while starting fails the test with its output;
    servers still running at the end of the test are killed."""
    import socket
    import subprocess
    import sys

    started = []

    def start(index, *args: str, timeout: float = 90.0):
        from hybridret.client import Client, ServerUnavailableError

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
        proc = subprocess.Popen([sys.executable, "-m", "hybridret", "serve", str(index), "--host", "127.0.0.1",
                                 "--port", str(port), *args], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        with Client(url, timeout=5) as client:
            for _ in range(int(timeout / 2)):
                try:
                    client.wait_ready(timeout=2)
                    return proc, url
                except ServerUnavailableError:
                    if proc.poll() is not None:
                        pytest.fail(f"hybridret serve exited while starting:\n{proc.stdout.read()}")
        pytest.fail(f"hybridret serve did not answer within {timeout} s")

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
