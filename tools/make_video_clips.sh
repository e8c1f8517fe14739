#!/usr/bin/env bash
# Writes model/testdata/video/clips/: small clips made by Debian's ffmpeg from
# its synthetic sources (testsrc2, mandelbrot, sine), for
# tools/gen_video_goldens.py and the C++ video tests. A few KB each.
# Re-running may produce different bytes with another ffmpeg; the goldens are
# made from the committed files.
set -euo pipefail
out="$(dirname "$0")/../model/testdata/video/clips"
mkdir -p "$out"
ff=(ffmpeg -hide_banner -loglevel error -y -bitexact)
# H.264 in MP4, 21 frames (odd) at 10 fps.
"${ff[@]}" -f lavfi -i testsrc2=size=96x64:rate=10 -frames:v 21 -pix_fmt yuv420p \
  -c:v libx264 -preset veryfast -crf 30 "$out/h264_96x64_21f.mp4"
# VP9 in MP4, 16 frames at 8 fps, odd size.
"${ff[@]}" -f lavfi -i mandelbrot=size=70x54:rate=8 -frames:v 16 -pix_fmt yuv420p \
  -c:v libvpx-vp9 -b:v 0 -crf 45 -deadline realtime "$out/vp9_70x54_16f.mp4"
# The same in WebM: Matroska has no frame count (transformers' PyAV reader
# then samples nothing; mmserve counts the packets).
"${ff[@]}" -i "$out/vp9_70x54_16f.mp4" -c copy "$out/vp9_70x54_16f.webm"
# MPEG-4 part 2 in AVI, 9 frames at 25 fps, portrait.
"${ff[@]}" -f lavfi -i testsrc2=size=48x112:rate=25 -frames:v 9 -c:v mpeg4 -q:v 8 \
  "$out/mpeg4_48x112_9f.avi"
# Unsupported video codec (FFV1) in Matroska.
"${ff[@]}" -f lavfi -i testsrc2=size=32x32:rate=5 -frames:v 4 -c:v ffv1 "$out/ffv1_32x32.mkv"
# No video stream at all.
"${ff[@]}" -f lavfi -i sine=frequency=440:duration=0.2 -c:a pcm_u8 -ar 8000 "$out/audio_only.wav"
# Hostile headers: a video stream with no frames; 72 frames at 1/100 fps
# (a header claiming two hours); one 7680x4320 (8K) frame.
"${ff[@]}" -f lavfi -i testsrc2=size=32x32:rate=5 -frames:v 0 -c:v mpeg4 "$out/zero_frames.avi"
"${ff[@]}" -f lavfi -i color=c=blue:size=16x16:rate=0.01 -frames:v 72 -c:v libx264 "$out/hours.mp4"
"${ff[@]}" -f lavfi -i color=c=red:size=7680x4320:rate=1 -frames:v 1 -c:v libvpx-vp9 \
  -deadline realtime -cpu-used 8 -b:v 0 -crf 63 "$out/8k_vp9.webm"
ls -l "$out"
