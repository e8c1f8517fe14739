#!/usr/bin/python3
"""A small Python client of mmserve's public gRPC API (mmserve.v1.Inference).

Uses Debian's python3-grpcio and python3-protobuf (run it with /usr/bin/python3)
and the stubs that client/python/gen_stubs.sh generates into client/python/gen/
(or the folder named by $MMSERVE_STUBS_DIR).

    from mmserve_client import MmserveClient

    with MmserveClient("localhost:50051") as client:
        for delta in client.generate("Where is the red square?",
                                     images=["tools/demo/eval_set/0000.png"],
                                     temperature=0, max_tokens=16):
            print(delta, end="", flush=True)
        print()
        print(client.last_response.usage)   # the final response: usage, finish_reason

As a command:

    client/python/mmserve_client.py --address=localhost:50051 \
        --image=tools/demo/eval_set/0000.png --prompt="Where is the red square?"

Errors raise grpc.RpcError (.code(), .details()); the command prints them and
exits with the gRPC code's number.
"""

import argparse
import json
import os
import sys

_STUBS = os.environ.get("MMSERVE_STUBS_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "gen")
sys.path.insert(0, _STUBS)

import grpc  # noqa: E402  (Debian: python3-grpcio)
from google.protobuf import json_format  # noqa: E402

try:
    from proto import common_pb2, inference_pb2, inference_pb2_grpc  # noqa: E402
except ImportError as e:  # pragma: no cover - a setup error, explained
    raise ImportError(
        f"mmserve stubs not found in {_STUBS}: run client/python/gen_stubs.sh first") from e

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"

# SamplingParams fields settable as keyword arguments, vLLM's names.
_SCALAR_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "max_tokens",
                    "ignore_eos", "logprobs", "min_tokens", "skip_special_tokens",
                    "presence_penalty", "frequency_penalty", "repetition_penalty")
_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
         ".bmp": "image/bmp", ".gif": "image/gif", ".mp4": "video/mp4", ".m4v": "video/mp4",
         ".webm": "video/webm", ".mkv": "video/x-matroska", ".mov": "video/quicktime",
         ".avi": "video/x-msvideo"}


def _image(item):
    """An Image message from a path or from raw bytes."""
    if isinstance(item, (bytes, bytearray)):
        return common_pb2.Image(data=bytes(item))
    path = os.fspath(item)
    with open(path, "rb") as f:
        data = f.read()
    mime = _MIME.get(os.path.splitext(path)[1].lower(), "")
    return common_pb2.Image(data=data, mime_type=mime)


def _video(item, fps=None, max_frames=None):
    """A Video message from a path or raw bytes (a container file), or from a
    list of frames (each a path or bytes); fps/max_frames as in
    mmserve.v1.Video (None: the processor's defaults)."""
    if isinstance(item, (list, tuple)):
        video = common_pb2.Video(frames=common_pb2.VideoFrames(frames=[_image(f) for f in item]))
    elif isinstance(item, (bytes, bytearray)):
        video = common_pb2.Video(data=bytes(item))
    else:
        path = os.fspath(item)
        with open(path, "rb") as f:
            video = common_pb2.Video(data=f.read(),
                                     mime_type=_MIME.get(os.path.splitext(path)[1].lower(), ""))
    if fps is not None:
        video.fps = fps
    if max_frames is not None:
        video.max_frames = max_frames
    return video


def sampling_params(**sampling):
    """SamplingParams from vLLM-style keyword arguments; None means unset."""
    params = common_pb2.SamplingParams()
    for key, value in sampling.items():
        if value is None:
            continue
        if key == "stop":
            params.stop.extend([value] if isinstance(value, str) else list(value))
        elif key == "stop_token_ids":
            params.stop_token_ids.extend(value)
        elif key == "logit_bias":  # {token id: bias}, ids as ints or strings (OpenAI's)
            for token, bias in value.items():
                params.logit_bias.add(token_id=int(token), bias=bias)
        elif key == "guided_json":  # structured output: a JSON schema (dict or JSON text)
            params.constraint.json_schema = value if isinstance(value, str) else json.dumps(value)
        elif key == "guided_regex":
            params.constraint.regex = value
        elif key == "guided_grammar":  # EBNF (llama.cpp's GBNF), start rule root
            params.constraint.grammar = value
        elif key == "json_object":  # any JSON object
            params.constraint.json_object = value
        elif key in _SCALAR_SAMPLING:
            setattr(params, key, value)
        else:
            raise TypeError(f"unknown sampling parameter {key!r}")
    return params


def build_request(prompt="", images=(), system=None, model="", raw=False, request_id="",
                  include_token_ids=False, videos=(), video_fps=None, video_max_frames=None,
                  **sampling):
    """The GenerateRequest for a chat (or a raw prompt with raw=True). The
    user turn holds the images, then the videos, then the prompt."""
    request = inference_pb2.GenerateRequest(model=model, request_id=request_id,
                                            sampling=sampling_params(**sampling))
    request.stream.include_usage = True
    request.stream.include_timing = True
    request.stream.include_token_ids = include_token_ids
    images = [_image(i) for i in images]
    videos = [_video(v, video_fps, video_max_frames) for v in videos]
    if not prompt and not images and not videos:
        raise ValueError("nothing to send: give a prompt and/or images or videos")
    if raw:
        if prompt.count(IMAGE_PLACEHOLDER) != len(images):
            raise ValueError(f"raw prompt holds {prompt.count(IMAGE_PLACEHOLDER)} image "
                             f"placeholder(s) but {len(images)} image(s) were given")
        if prompt.count(VIDEO_PLACEHOLDER) != len(videos):
            raise ValueError(f"raw prompt holds {prompt.count(VIDEO_PLACEHOLDER)} video "
                             f"placeholder(s) but {len(videos)} video(s) were given")
        if system:
            raise ValueError("system has no meaning with raw=True")
        request.raw.text = prompt
        request.raw.images.extend(images)
        request.raw.videos.extend(videos)
        return request
    if system:
        request.chat.messages.add(role="system").content.add(text=system)
    user = request.chat.messages.add(role="user")
    for image in images:
        user.content.add(image=image)
    for video in videos:
        user.content.add(video=video)
    if prompt:
        user.content.add(text=prompt)
    return request


class MmserveClient:
    """A channel to an mmserve router. Thread-safe like the grpc channel under it."""

    def __init__(self, address="localhost:50051", api_key=None, tls_ca=None):
        """api_key: the router's --api_key (default: $MMSERVE_API_KEY), sent as
        metadata authorization: Bearer <key>. tls_ca: a PEM file of the CA that
        signed the router's certificate (--tls_cert): call it over TLS."""
        if tls_ca:
            with open(tls_ca, "rb") as f:
                credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
            self._channel = grpc.secure_channel(address, credentials)
        else:
            self._channel = grpc.insecure_channel(address)
        api_key = api_key if api_key is not None else os.environ.get("MMSERVE_API_KEY", "")
        self._metadata = (("authorization", "Bearer " + api_key),) if api_key else ()
        self._stub = inference_pb2_grpc.InferenceStub(self._channel)
        # The final GenerateResponse of the last generate() (usage, finish_reason).
        self.last_response = None

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def generate_responses(self, prompt="", images=(), timeout=None, **kwargs):
        """Yields every GenerateResponse as it arrives. Stopping early cancels the call."""
        call = self._stub.Generate(build_request(prompt, images, **kwargs), timeout=timeout,
                                   metadata=self._metadata)
        try:
            for response in call:
                if response.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED:
                    self.last_response = response
                yield response
        finally:
            call.cancel()  # no-op when the call already finished

    def generate(self, prompt="", images=(), timeout=None, **kwargs):
        """Yields the completion's text deltas as they arrive.

        images: paths or bytes. kwargs: videos (paths, bytes or lists of
        frames), video_fps, video_max_frames, system, model, raw, request_id, and the
        sampling parameters temperature, top_p, top_k, min_p, seed, max_tokens,
        stop (str or list), stop_token_ids, ignore_eos, logprobs, min_tokens,
        skip_special_tokens, presence_penalty, frequency_penalty,
        repetition_penalty, logit_bias ({token id: bias}), and one output
        constraint: guided_json (a JSON schema, dict or text), guided_regex,
        guided_grammar (EBNF) or json_object=True. timeout: seconds for the
        whole call.
        """
        self.last_response = None
        responses = self.generate_responses(prompt, images, timeout=timeout, **kwargs)
        try:
            for response in responses:
                if response.text:
                    yield response.text
        finally:
            responses.close()  # cancels the call when the caller stops early

    def list_models(self, timeout=None):
        return self._stub.ListModels(inference_pb2.ListModelsRequest(), timeout=timeout,
                                     metadata=self._metadata)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Ask an mmserve router over gRPC.")
    parser.add_argument("--address", default="localhost:50051")
    parser.add_argument("--prompt", default="")
    parser.add_argument("--image", action="append", default=[], help="repeatable")
    parser.add_argument("--video", action="append", default=[], help="a video file; repeatable")
    parser.add_argument("--video_fps", type=float, help="frames sampled per second")
    parser.add_argument("--video_max_frames", type=int)
    parser.add_argument("--system")
    parser.add_argument("--model", default="")
    parser.add_argument("--raw", action="store_true")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top_p", type=float)
    parser.add_argument("--top_k", type=int)
    parser.add_argument("--min_p", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--max_tokens", type=int)
    parser.add_argument("--stop", action="append", default=[], help="repeatable")
    parser.add_argument("--ignore_eos", action="store_true")
    parser.add_argument("--logprobs", type=int)
    parser.add_argument("--min_tokens", type=int)
    parser.add_argument("--deadline_ms", type=int, default=0)
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per GenerateResponse")
    parser.add_argument("--list_models", action="store_true")
    parser.add_argument("--api_key", help="default: $MMSERVE_API_KEY")
    parser.add_argument("--tls_ca", help="PEM CA of the router's certificate: use TLS")
    args = parser.parse_args(argv)
    timeout = args.deadline_ms / 1000 if args.deadline_ms > 0 else None

    with MmserveClient(args.address, api_key=args.api_key, tls_ca=args.tls_ca) as client:
        try:
            if args.list_models:
                models = client.list_models(timeout=timeout)
                for m in models.models:
                    print(f"{m.id}\tmax_model_len={m.max_model_len}")
                return 0
            kwargs = dict(system=args.system, model=args.model, raw=args.raw,
                          videos=args.video, video_fps=args.video_fps,
                          video_max_frames=args.video_max_frames,
                          temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                          min_p=args.min_p, seed=args.seed, max_tokens=args.max_tokens,
                          stop=args.stop or None, ignore_eos=args.ignore_eos or None,
                          logprobs=args.logprobs, min_tokens=args.min_tokens)
            if args.json:
                for r in client.generate_responses(args.prompt, args.image, timeout=timeout,
                                                   **kwargs):
                    print(json_format.MessageToJson(r, indent=None), flush=True)
                return 0
            wrote = False
            for delta in client.generate(args.prompt, args.image, timeout=timeout, **kwargs):
                print(delta, end="", flush=True)
                wrote = True
            if wrote:
                print()
            final = client.last_response
            if final is not None:
                u = final.usage
                reason = common_pb2.FinishReason.Name(final.finish_reason)
                reason = reason.replace("FINISH_REASON_", "").lower()
                print(f"finish_reason={reason} "
                      f"prompt_tokens={u.prompt_tokens} completion_tokens={u.completion_tokens} "
                      f"ttft_ms={final.timing.ttft_ms:.1f} e2e_ms={final.timing.e2e_ms:.1f}",
                      file=sys.stderr)
            return 0
        except grpc.RpcError as e:
            print(f"error: {e.code().name}: {e.details()}", file=sys.stderr)
            return e.code().value[0]
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 3


if __name__ == "__main__":
    sys.exit(main())
