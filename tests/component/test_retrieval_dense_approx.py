"""Approximate dense indexes (PQ, and OPQ/PCA pre-transforms) through build -> load -> search.

A stand-in encoder (deterministic, anisotropic 384-d vectors hashed from the text, so PCA has
directions to find) replaces MiniLM, so 600 passages build in seconds. Every index's results are
checked against brute force over its own reconstructed vectors: for an inner-product index the
score of passage x must be ``q · reconstruct(x)``, whatever the compression.
"""

import json
import zlib

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

import sleuth.cli  # noqa: E402
import sleuth.retrieval.dense as dense_mod  # noqa: E402
from sleuth.retrieval.dense import disable_polysemous_training, make_faiss_index  # noqa: E402
from sleuth.retrieval.index import load_index, read_meta  # noqa: E402

pytestmark = pytest.mark.component

DIM, RANK, TOPICS, N_PASSAGES = 384, 48, 12, 600


class HashEncoder:
    """Encoder stand-in: text -> B (centre[topic] + noise) + small isotropic noise, L2-normalised.

    The topic is the number after ``topic`` in the text; the noise is seeded by a hash of the text,
    so the same text always gives the same vector. Most variance lies in a 48-d subspace."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.basis_DR = rng.standard_normal((DIM, RANK)) * np.linspace(2.0, 0.2, RANK)
        self.centre_TR = rng.standard_normal((TOPICS, RANK))
        self.offset_D = 0.5 * rng.standard_normal(DIM)  # a shared mean, as real embeddings have

    def get_embedding_dimension(self) -> int:
        return DIM

    def encode(self, texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True,
               show_progress_bar=False):
        out_ND = np.empty((len(texts), DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            words = text.split()
            topic = int(words[words.index("topic") + 1]) % TOPICS if "topic" in words else 0
            rng = np.random.default_rng(zlib.crc32(text.encode()))
            z_R = self.centre_TR[topic] + 0.6 * rng.standard_normal(RANK)
            out_ND[i] = self.basis_DR @ z_R + self.offset_D + 0.05 * rng.standard_normal(DIM)
        return out_ND / np.linalg.norm(out_ND, axis=1, keepdims=True)


QUERIES = [f"question about topic {t} number {j}" for t in range(TOPICS) for j in range(3)]


@pytest.fixture(autouse=True, scope="module")
def one_faiss_thread():
    """One OpenMP thread: the cores are shared, and spinning OpenMP workers slow k-means tenfold."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.fixture(scope="module")
def encoder():
    return HashEncoder()


@pytest.fixture
def stub_encoder(monkeypatch, encoder):
    monkeypatch.setattr(dense_mod, "load_encoder", lambda name, device=None: encoder)
    monkeypatch.setattr(sleuth.cli, "COMMAND_MODULES", ["sleuth.retrieval.cli"])
    return encoder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("approx") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "title": f"P{i}", "text": f"topic {i % TOPICS} passage {i}"})
                            + "\n" for i in range(N_PASSAGES)))
    return path


def build_cli(corpus, out, factory, capsys) -> dict:
    rc = sleuth.cli.main(["index", "build", "--corpus", str(corpus), "--kind", "dense", "--faiss", factory,
                          "--encoder", "stub", "--out", str(out), "--json"])
    assert rc == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("factory,code_bytes", [
    ("PCAR256,SQ6", 192),  # the bench's choice: 1/8 of Flat per vector
    ("PQ192", 192),
    ("OPQ16_64,PQ16", 16),  # OPQ rotation with a dimension reduction
    ("PCA64,SQ8", 64),
])
def test_build_load_search_matches_reconstruction(stub_encoder, corpus, tmp_path, capsys, factory, code_bytes):
    summary = build_cli(corpus, tmp_path / "idx", factory, capsys)
    assert summary["faiss_factory"] == factory and summary["n_passages"] == N_PASSAGES
    meta = read_meta(tmp_path / "idx")
    assert meta["dense"]["code_bytes"] == code_bytes and meta["dense"]["flat_code_bytes"] == 4 * DIM
    assert meta["recall"]["n_queries"] == 200 and meta["recall"]["value"] >= 0.5
    retriever = load_index(tmp_path / "idx")
    recon_ND = retriever.index.reconstruct_n(0, retriever.index.ntotal)  # decoded, back in input space
    q_QD = stub_encoder.encode(QUERIES)
    sim_QN = q_QD @ recon_ND.T
    for sim_N, (rows, scores) in zip(sim_QN, retriever.search_rows(QUERIES, k=5)):
        ref = np.argsort(-sim_N)[:5]
        np.testing.assert_allclose(scores, sim_N[ref], atol=2e-4)
        np.testing.assert_allclose(sim_N[rows], sim_N[ref], atol=2e-4)  # same rows up to near-ties
    # the compressed index still finds each query's topic
    top = retriever.search(QUERIES, k=1)
    assert np.mean([int(ps[0].text.split()[1]) == int(q.split()[3]) for q, ps in zip(QUERIES, top)]) >= 0.9


def test_pca_keeps_inner_products(encoder):
    """A full-rank PCA is a rotation: with the mean (bias) dropped it must rank exactly as Flat.

    faiss' PCA subtracts the mean m from queries and passages; (q - m)·(x - m) = q·x - q·m - m·x + |m|²
    differs from q·x by -m·x, which varies per passage, so keeping the bias would reorder results."""
    x_ND = encoder.encode([f"topic {i % TOPICS} passage {i}" for i in range(400)])
    q_QD = encoder.encode(QUERIES)
    index = make_faiss_index(DIM, f"PCA{DIM},Flat", lambda m: x_ND[:m], len(x_ND))
    index.add(x_ND)
    scores_QK, rows_QK = index.search(q_QD, 10)
    sim_QN = q_QD @ x_ND.T
    np.testing.assert_allclose(scores_QK, np.take_along_axis(sim_QN, rows_QK, 1), atol=1e-4)
    np.testing.assert_array_equal(rows_QK, np.argsort(-sim_QN, axis=1)[:, :10])


def test_polysemous_training_is_off():
    for factory in ("PQ8", "OPQ8,PQ8", "IVF4,PQ8"):
        index = faiss.index_factory(32, factory, faiss.METRIC_INNER_PRODUCT)
        inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexPreTransform) else index
        assert inner.do_polysemous_training  # what the factory sets ...
        disable_polysemous_training(index)
        assert not inner.do_polysemous_training  # ... and what we build with


def test_pq_on_too_few_passages_is_a_clear_error(stub_encoder, tmp_path, capsys):
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"id": f"s{i}", "title": "t", "text": f"topic 1 x {i}"}) + "\n"
                             for i in range(40)))
    rc = sleuth.cli.main(["index", "build", "--corpus", str(small), "--kind", "dense", "--faiss", "PQ192",
                          "--encoder", "stub", "--out", str(tmp_path / "idx")])
    err = capsys.readouterr().err
    assert rc != 0 and "'PQ192' cannot be trained on 40 passages" in err


@pytest.mark.parametrize("factory, params, words", [
    ("IVF4,Flat", "nprobe=abc", "could not interpret parameters nprobe=abc"),
    ("Flat", "nprobe=8", "could not set parameter nprobe"),
])
def test_bad_faiss_search_params_fail_before_encoding(stub_encoder, monkeypatch, tmp_path, capsys,
                                                       factory, params, words):
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"id": f"s{i}", "text": f"topic 1 x {i}"}) + "\n" for i in range(40)))
    encoded = []
    monkeypatch.setattr(dense_mod, "encode_corpus", lambda *a, **kw: encoded.append(1))
    rc = sleuth.cli.main(["index", "build", "--corpus", str(small), "--kind", "dense", "--faiss", factory,
                          "--faiss-search-params", params, "--encoder", "stub", "--out", str(tmp_path / "idx")])
    err = capsys.readouterr().err
    assert rc == 2 and "sleuth: error: --faiss-search-params" in err and f"'{params}'" in err
    assert words in err and "nprobe=32 for IVF" in err and "Traceback" not in err
    assert encoded == []  # refused before the corpus was encoded


def test_damaged_dense_index_says_how_to_rebuild(stub_encoder, tmp_path, capsys):
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"id": f"s{i}", "text": f"topic 1 x {i}"}) + "\n" for i in range(40)))
    idx = tmp_path / "idx"
    build_cli(small, idx, "Flat", capsys)
    (idx / "dense" / "faiss.index").write_bytes(b"garbage!")
    with pytest.raises(ValueError, match=r"damaged or incomplete: cannot read .*faiss\.index") as e:
        load_index(idx)
    assert f"--kind dense --out {idx} --overwrite" in str(e.value) and "/project/faiss" not in str(e.value)
    (idx / "dense" / "faiss.index").unlink()
    with pytest.raises(ValueError, match=r"faiss\.index is missing\). Rebuild it"):
        load_index(idx)


def test_auto_factory_is_flat_for_small_corpora_and_compressed_for_large(stub_encoder, corpus, tmp_path, capsys,
                                                                         monkeypatch):
    from sleuth.retrieval.dense import resolve_factory

    assert resolve_factory("auto", 1_000_000, 768) == "Flat" and resolve_factory("Auto", 21_000_000, 768) == \
        "PCAR256,SQ6"
    assert resolve_factory("auto", 21_000_000, 256) == "SQ8" and resolve_factory("HNSW32", 10, 8) == "HNSW32"
    rc = sleuth.cli.main(["index", "build", "--corpus", str(corpus), "--kind", "dense", "--encoder", "stub",
                          "--out", str(tmp_path / "small"), "--json"])  # no --faiss: auto
    assert rc == 0 and json.loads(capsys.readouterr().out.strip().splitlines()[-1])["faiss_factory"] == "Flat"
    monkeypatch.setattr(dense_mod, "AUTO_FLAT_MAX", N_PASSAGES - 1)  # this corpus now counts as large
    rc = sleuth.cli.main(["index", "build", "--corpus", str(corpus), "--kind", "dense", "--encoder", "stub",
                          "--out", str(tmp_path / "large"), "--json"])
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and summary["faiss_factory"] == "PCAR256,SQ6"
    assert summary["recall"]["n_queries"] == 200 and 0 < summary["recall"]["value"] <= 1  # measured and printed
    assert "recall@10 vs exact" in out
    assert read_meta(tmp_path / "large")["dense"]["code_bytes"] == 192  # 1/8 of Flat's 1536


def test_sharded_encoding_then_a_merge_build_equals_one_build(stub_encoder, corpus, tmp_path, capsys, monkeypatch):
    """Two shard runs (separate --out, a shared --cache-dir) encode disjoint chunks; the build without --shard
    encodes nothing and gives the same index as one unsharded build."""
    import sleuth.retrieval.embcache as embcache

    monkeypatch.setattr(embcache, "CHUNK_ROWS", 100)  # 6 chunks of this corpus
    encoded: list[int] = []
    real_encode = stub_encoder.encode
    monkeypatch.setattr(stub_encoder, "encode", lambda texts, **kw: encoded.append(len(texts)) or real_encode(texts))
    base = ["index", "build", "--corpus", str(corpus), "--kind", "dense", "--encoder", "stub", "--faiss", "Flat",
            "--cache-dir", str(tmp_path / "cache")]
    per_shard = []
    for i in range(2):
        encoded.clear()
        assert sleuth.cli.main(base + ["--shard", f"{i}/2", "--out", str(tmp_path / f"shard{i}")]) == 0
        per_shard.append(sum(encoded) - 1)  # less the one-text dimension probe
        assert "once every shard has run" in capsys.readouterr().out
        assert not (tmp_path / f"shard{i}" / "meta.json").exists()  # no index from a shard run
    assert per_shard == [300, 300]  # chunks 0, 2, 4 and 1, 3, 5
    encoded.clear()
    assert sleuth.cli.main(base + ["--out", str(tmp_path / "merged")]) == 0
    assert sum(encoded) == 1  # the dimension probe only: every passage came from the cache
    monkeypatch.setattr(embcache, "CHUNK_ROWS", 4096)
    assert sleuth.cli.main(base[:-2] + ["--out", str(tmp_path / "one")]) == 0
    a, b = load_index(tmp_path / "merged"), load_index(tmp_path / "one")
    assert a.search_rows(QUERIES, 5)[0][0].tolist() == b.search_rows(QUERIES, 5)[0][0].tolist()
    for (ra, sa), (rb, sb) in zip(a.search_rows(QUERIES, 5), b.search_rows(QUERIES, 5)):
        assert ra.tolist() == rb.tolist() and np.array_equal(sa, sb)
    capsys.readouterr()
    assert sleuth.cli.main(base + ["--shard", "2/2", "--out", str(tmp_path / "bad")]) == 2
    assert sleuth.cli.main(base[:-2] + ["--shard", "0/2", "--out", str(tmp_path / "bad2")]) == 2
    err = capsys.readouterr().err
    assert "need 0 <= I < N" in err and "--shard applies to --kind dense with a --cache-dir" in err
