"""Media repository figures against a real server process: prints numbers, judges nothing.

    .venv/bin/python -m loadtests.media_bench

Times a large upload and download (and the server's peak memory around them), the upload of
camera-sized images with the spec's thumbnails made at upload, and a thumbnail made on demand.
"""

from gevent import monkey

monkey.patch_all()

import hashlib
import io
import os
import tempfile
import time

from PIL import Image

from tests.support.server import MatrixClient, WeirProcess, base_settings

LARGE_MB = 48


def peak_rss_mb(server) -> float:
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def photo(fmt: str, size=(4000, 3000)) -> bytes:
    # Noise-like content, so the encoder cannot shrink it to nothing.
    image = Image.effect_mandelbrot(size, (-2.0, -1.5, 1.0, 1.5), 100).convert("RGB")
    out = io.BytesIO()
    image.save(out, fmt, quality=90) if fmt == "JPEG" else image.save(out, fmt)
    return out.getvalue()


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def main() -> None:
    directory = tempfile.mkdtemp(prefix="weir-media-bench-")
    server = WeirProcess(directory, base_settings(os.path.join(directory, "data"))).start()
    try:
        client = MatrixClient(server.client_url)
        client.register("bench")

        data = os.urandom(LARGE_MB << 20)
        rss_before = peak_rss_mb(server)
        r, upload_s = timed(lambda: client.post("/_matrix/media/v3/upload", data=data))
        mxc = r.json()["content_uri"][len("mxc://") :]

        def download():
            digest = hashlib.sha256()
            with client.get(f"/_matrix/client/v1/media/download/{mxc}", stream=True) as resp:
                for chunk in resp.iter_content(1 << 20):
                    digest.update(chunk)
            return digest.hexdigest()

        digest, download_s = timed(download)
        assert digest == hashlib.sha256(data).hexdigest()
        print(f"{LARGE_MB} MB upload:   {upload_s:6.2f} s  {LARGE_MB / upload_s:7.1f} MB/s")
        print(f"{LARGE_MB} MB download: {download_s:6.2f} s  {LARGE_MB / download_s:7.1f} MB/s")
        print(f"server peak RSS: {rss_before:.0f} MB before, {peak_rss_mb(server):.0f} MB after")

        for fmt, content_type in (("JPEG", "image/jpeg"), ("PNG", "image/png")):
            image = photo(fmt)
            r, seconds = timed(
                lambda: client.post(
                    "/_matrix/media/v3/upload", data=image, headers={"Content-Type": content_type}
                )
            )
            mxc = r.json()["content_uri"][len("mxc://") :]
            print(
                f"12 Mpx {fmt} ({len(image) >> 10} KB) upload with 5 thumbnails: {seconds:5.2f} s"
            )
            _, stored = timed(
                lambda: client.get(
                    f"/_matrix/client/v1/media/thumbnail/{mxc}?width=96&height=96&method=crop"
                )
            )
            _, on_demand = timed(
                lambda: client.get(
                    f"/_matrix/client/v1/media/thumbnail/{mxc}?width=1000&height=700&method=crop"
                )
            )
            print(
                f"  thumbnail served from store: {stored * 1000:6.1f} ms, "
                f"made on demand (1000x700 crop): {on_demand * 1000:6.1f} ms"
            )
        print(f"server peak RSS at the end: {peak_rss_mb(server):.0f} MB")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
