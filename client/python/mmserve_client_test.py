#!/usr/bin/python3
"""Tests the Python client, and the C++ cli when $MMSERVE_CLI names it, against
a fake mmserve.v1.Inference server run in this process with grpcio.

Run by //client:python_client_test (client/python/client_test.sh), which
generates the stubs into a temporary folder first.
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mmserve_client  # noqa: E402  (puts the stubs on sys.path)
import grpc  # noqa: E402
from proto import common_pb2, inference_pb2, inference_pb2_grpc  # noqa: E402


class FakeInference(inference_pb2_grpc.InferenceServicer):
    """Streams the last text part back one word per response."""

    def __init__(self):
        self.requests = []
        self.cancelled = threading.Event()

    def Generate(self, request, context):
        self.requests.append(request)
        if request.model == "bad":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, 'unknown model "bad"')
        if request.model == "keyed":  # as the router with --api_key=sk-1
            if dict(context.invocation_metadata()).get("authorization") != "Bearer sk-1":
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "Incorrect API key provided")
        if request.model in ("slow", "one_then_wait"):
            context.add_callback(self.cancelled.set)
            if request.model == "one_then_wait":
                yield inference_pb2.GenerateResponse(text="first")
            while context.is_active():
                time.sleep(0.01)
            return
        parts = request.chat.messages[-1].content if request.HasField("chat") else []
        text = next((p.text for p in reversed(parts) if p.HasField("text")), request.raw.text)
        words = text.split(" ")
        for i, word in enumerate(words):
            yield inference_pb2.GenerateResponse(
                request_id="fake-1", text=word + (" " if i + 1 < len(words) else ""))
        final = inference_pb2.GenerateResponse(request_id="fake-1",
                                               finish_reason=common_pb2.FINISH_REASON_LENGTH,
                                               seed=7)
        final.usage.prompt_tokens = 11
        final.usage.completion_tokens = len(words)
        final.timing.ttft_ms = 1.5
        yield final

    def ListModels(self, request, context):
        return inference_pb2.ListModelsResponse(
            models=[inference_pb2.ModelCard(id="shapes-demo", max_model_len=4096)])


class FakeServerTest(unittest.TestCase):
    """Starts a fake server for each test class."""

    @classmethod
    def setUpClass(cls):
        cls.service = FakeInference()
        cls.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        inference_pb2_grpc.add_InferenceServicer_to_server(cls.service, cls.server)
        cls.port = cls.server.add_insecure_port("127.0.0.1:0")
        cls.server.start()
        cls.address = f"127.0.0.1:{cls.port}"
        cls.tmp = tempfile.TemporaryDirectory()
        cls.image_path = os.path.join(cls.tmp.name, "shot,1.png")  # a comma in the path
        with open(cls.image_path, "wb") as f:
            f.write(b"\x89PNG not really")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(None)
        cls.tmp.cleanup()


class ClientTest(FakeServerTest):

    def test_generate_yields_deltas_and_keeps_the_final_response(self):
        with mmserve_client.MmserveClient(self.address) as client:
            deltas = list(client.generate("top left corner", images=[self.image_path],
                                          system="Be brief.", temperature=0, max_tokens=5,
                                          stop=["\n", "END"], top_k=3, seed=9))
            self.assertEqual(deltas, ["top ", "left ", "corner"])
            self.assertEqual(client.last_response.finish_reason,
                             common_pb2.FINISH_REASON_LENGTH)
            self.assertEqual(client.last_response.usage.completion_tokens, 3)

        request = self.service.requests[-1]
        self.assertEqual([m.role for m in request.chat.messages], ["system", "user"])
        user = request.chat.messages[1]
        self.assertEqual(user.content[0].image.data, b"\x89PNG not really")
        self.assertEqual(user.content[0].image.mime_type, "image/png")
        self.assertEqual(user.content[1].text, "top left corner")
        s = request.sampling
        self.assertTrue(s.HasField("temperature"))
        self.assertEqual(s.temperature, 0)
        self.assertEqual(s.max_tokens, 5)
        self.assertEqual(list(s.stop), ["\n", "END"])
        self.assertEqual(s.top_k, 3)
        self.assertEqual(s.seed, 9)
        self.assertFalse(s.HasField("top_p"))
        self.assertTrue(request.stream.include_usage)

    def test_build_request_refusals(self):
        with self.assertRaises(ValueError):
            mmserve_client.build_request()
        with self.assertRaises(ValueError):
            mmserve_client.build_request("no placeholder", images=[b"x"], raw=True)
        with self.assertRaises(TypeError):
            mmserve_client.build_request("hi", best_of=2)
        penalised = mmserve_client.build_request(
            "hi", frequency_penalty=0.5, presence_penalty=-1, repetition_penalty=1.2,
            logit_bias={"7": -100, 42: 2.5}).sampling
        self.assertEqual(penalised.frequency_penalty, 0.5)
        self.assertEqual(penalised.presence_penalty, -1)
        self.assertAlmostEqual(penalised.repetition_penalty, 1.2, places=6)
        self.assertEqual([(b.token_id, b.bias) for b in penalised.logit_bias],
                         [(7, -100.0), (42, 2.5)])
        raw = mmserve_client.build_request(
            "a " + mmserve_client.IMAGE_PLACEHOLDER, images=[b"img"], raw=True)
        self.assertEqual(raw.raw.images[0].data, b"img")

    def test_build_request_videos(self):
        request = mmserve_client.build_request("what happens?", images=[b"img"],
                                               videos=[b"clip", [b"f0", b"f1"]], video_fps=2.0,
                                               video_max_frames=8)
        user = request.chat.messages[0]
        self.assertEqual(user.content[0].image.data, b"img")
        self.assertEqual(user.content[1].video.data, b"clip")
        self.assertEqual(user.content[1].video.fps, 2.0)
        self.assertEqual(user.content[1].video.max_frames, 8)
        self.assertEqual([f.data for f in user.content[2].video.frames.frames], [b"f0", b"f1"])
        self.assertEqual(user.content[3].text, "what happens?")
        raw = mmserve_client.build_request("a " + mmserve_client.VIDEO_PLACEHOLDER,
                                           videos=[b"clip"], raw=True)
        self.assertEqual(raw.raw.videos[0].data, b"clip")
        self.assertFalse(raw.raw.videos[0].HasField("fps"))
        with self.assertRaises(ValueError):
            mmserve_client.build_request("no placeholder", videos=[b"x"], raw=True)

    def test_errors_raise_rpc_error_with_the_code(self):
        with mmserve_client.MmserveClient(self.address) as client:
            with self.assertRaises(grpc.RpcError) as ctx:
                list(client.generate("x", model="bad"))
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertEqual(ctx.exception.details(), 'unknown model "bad"')
            with self.assertRaises(grpc.RpcError) as ctx:
                list(client.generate("x", model="slow", timeout=0.2))
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)

    def test_stopping_early_cancels_the_call(self):
        self.service.cancelled.clear()
        with mmserve_client.MmserveClient(self.address) as client:
            stream = client.generate("x", model="one_then_wait")
            self.assertEqual(next(stream), "first")
            stream.close()
            self.assertTrue(self.service.cancelled.wait(10))

    def test_list_models(self):
        with mmserve_client.MmserveClient(self.address) as client:
            models = client.list_models(timeout=5)
        self.assertEqual([m.id for m in models.models], ["shapes-demo"])

    def test_api_key_goes_as_bearer_metadata(self):
        with mmserve_client.MmserveClient(self.address, api_key="sk-1") as client:
            self.assertEqual("".join(client.generate("a b", model="keyed", timeout=10)), "a b")
        with mmserve_client.MmserveClient(self.address, api_key="") as client:
            with self.assertRaises(grpc.RpcError) as e:
                "".join(client.generate("a b", model="keyed", timeout=10))
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)

    def test_python_command_line(self):
        out = subprocess.run(
            [sys.executable, mmserve_client.__file__, f"--address={self.address}",
             "--prompt=hello there", f"--image={self.image_path}", "--stop=a,b", "--stop=c"],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout, "hello there\n")
        self.assertIn("finish_reason=length prompt_tokens=11 completion_tokens=2", out.stderr)
        self.assertEqual(list(self.service.requests[-1].sampling.stop), ["a,b", "c"])

        bad = subprocess.run(
            [sys.executable, mmserve_client.__file__, f"--address={self.address}",
             "--prompt=x", "--model=bad"], capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 3)  # INVALID_ARGUMENT
        self.assertIn('INVALID_ARGUMENT: unknown model "bad"', bad.stderr)


class TlsTest(unittest.TestCase):
    """The client over TLS, against a fake server with a certificate that
    Debian's openssl makes here."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        subprocess.run(
            "set -e; openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2"
            " -subj /CN=test-ca 2>/dev/null; openssl req -newkey rsa:2048 -nodes -keyout s.key"
            " -out s.csr -subj /CN=localhost 2>/dev/null;"
            " printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > ext.cnf;"
            " openssl x509 -req -in s.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out s.pem"
            " -days 2 -extfile ext.cnf 2>/dev/null", shell=True, cwd=d, check=True)
        with open(os.path.join(d, "s.key"), "rb") as k, open(os.path.join(d, "s.pem"), "rb") as c:
            credentials = grpc.ssl_server_credentials([(k.read(), c.read())])
        cls.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
        inference_pb2_grpc.add_InferenceServicer_to_server(FakeInference(), cls.server)
        cls.port = cls.server.add_secure_port("127.0.0.1:0", credentials)
        cls.server.start()
        cls.ca = os.path.join(d, "ca.pem")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(None)
        cls.tmp.cleanup()

    def test_tls_with_the_ca_and_an_api_key(self):
        address = f"127.0.0.1:{self.port}"
        with mmserve_client.MmserveClient(address, api_key="sk-1", tls_ca=self.ca) as client:
            self.assertEqual("".join(client.generate("a b", model="keyed", timeout=10)), "a b")
        with mmserve_client.MmserveClient(address) as plain:  # plaintext to a TLS port
            with self.assertRaises(grpc.RpcError) as e:
                plain.list_models(timeout=5)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)


@unittest.skipUnless(os.environ.get("MMSERVE_CLI"), "MMSERVE_CLI (the C++ cli) not given")
class CppCliTest(FakeServerTest):
    """The C++ cli binary against the same fake server."""

    def cli(self, *args):
        return subprocess.run([os.environ["MMSERVE_CLI"], f"--address={self.address}", *args],
                              capture_output=True, text=True, timeout=60)

    def test_streams_text_and_prints_the_summary(self):
        out = self.cli("--prompt=top left", f"--image={self.image_path}",
                       f"--image={self.image_path}", "--temperature=0", "--max_tokens=4",
                       "--stop=x,y", "--stop", "z", "--system=Be brief.", "--seed=5")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout, "top left\n")
        self.assertIn("finish_reason=length prompt_tokens=11 completion_tokens=2", out.stderr)
        self.assertIn("seed=7", out.stderr)
        request = self.service.requests[-1]
        user = request.chat.messages[1]
        self.assertEqual([p.WhichOneof("part") for p in user.content], ["image", "image", "text"])
        self.assertEqual(list(request.sampling.stop), ["x,y", "z"])
        self.assertEqual(request.sampling.seed, 5)
        self.assertTrue(request.sampling.HasField("temperature"))
        self.assertFalse(request.sampling.HasField("top_p"))

    def test_json_prints_one_object_per_response(self):
        out = self.cli("--prompt=a b", "--json")
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertEqual(len(lines), 3)
        objects = [json.loads(line) for line in lines]
        self.assertEqual(objects[0], {"requestId": "fake-1", "text": "a "})
        self.assertEqual(objects[2]["finishReason"], "FINISH_REASON_LENGTH")
        self.assertEqual(objects[2]["usage"]["completionTokens"], 2)

    def test_errors_exit_with_the_grpc_code(self):
        out = self.cli("--prompt=x", "--model=bad")
        self.assertEqual(out.returncode, 3)
        self.assertIn('error: INVALID_ARGUMENT: unknown model "bad"', out.stderr)
        out = self.cli("--prompt=x", "--model=slow", "--deadline_ms=200")
        self.assertEqual(out.returncode, 4)  # DEADLINE_EXCEEDED
        self.assertIn("DEADLINE_EXCEEDED", out.stderr)

    def test_api_key_from_the_flag_or_the_environment(self):
        self.assertEqual(self.cli("--prompt=a", "--model=keyed", "--api_key=sk-1").returncode, 0)
        env = dict(os.environ, MMSERVE_API_KEY="sk-1")
        out = subprocess.run([os.environ["MMSERVE_CLI"], f"--address={self.address}", "--prompt=a",
                              "--model=keyed"], capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(out.returncode, 0, out.stderr)
        out = self.cli("--prompt=a", "--model=keyed", "--api_key=sk-2")
        self.assertEqual(out.returncode, 16, out.stderr)  # UNAUTHENTICATED
        self.assertIn("UNAUTHENTICATED", out.stderr)

    def test_list_models(self):
        out = self.cli("--list_models")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(out.stdout.startswith("shapes-demo\tmax_model_len=4096"))


if __name__ == "__main__":
    unittest.main()
