// The camera: its preview on the page, and its current picture as a JPEG for the appends.
//
// Camera.open(preview) asks the browser for the camera (the browser asks the user), shows it in the
// `preview` <video> element and resolves once the stream is there. grab(maxPixels) draws the
// picture shown now onto a canvas, scaled down to the size the model works at (wire.frameSize), and
// returns it as {data: bare base64 JPEG (no data: prefix), width, height, bytes}, synchronously (so
// the frame rides the very append the caller is building), or null while the camera has no picture
// yet. close() releases the device and empties the preview.

import { frameSize } from "./wire.js";

const JPEG_QUALITY = 0.7; // what vLLM-Omni's camera page sends; the model rescales anyway
const IDEAL_WIDTH = 640; // asked of the camera: enough for every model we know, cheap to encode
const IDEAL_HEIGHT = 480;
const JPEG_PREFIX = "data:image/jpeg;base64,";

export class Camera {
  static async open(preview) {
    const stream = await navigator.mediaDevices.getUserMedia({
      video: { width: { ideal: IDEAL_WIDTH }, height: { ideal: IDEAL_HEIGHT } },
      audio: false,
    });
    return new Camera(stream, preview);
  }

  constructor(stream, preview) {
    this.stream = stream;
    this.preview = preview;
    this.canvas = document.createElement("canvas");
    preview.srcObject = stream;
    preview.hidden = false;
    preview.play().catch(() => {}); // muted and inline: browsers let it play without a gesture
  }

  // True while the browser still holds the camera.
  get live() {
    return this.stream.getVideoTracks().some((t) => t.readyState === "live");
  }

  grab(maxPixels) {
    const video = this.preview;
    if (this.closed || video.readyState < HTMLMediaElement.HAVE_CURRENT_DATA || !video.videoWidth) return null;
    const [width, height] = frameSize(video.videoWidth, video.videoHeight, maxPixels);
    const canvas = this.canvas;
    if (canvas.width !== width || canvas.height !== height) {
      canvas.width = width;
      canvas.height = height;
    }
    canvas.getContext("2d").drawImage(video, 0, 0, width, height);
    const url = canvas.toDataURL("image/jpeg", JPEG_QUALITY);
    if (!url.startsWith(JPEG_PREFIX)) return null; // a browser without a JPEG encoder gives PNG
    const data = url.slice(JPEG_PREFIX.length);
    const padding = data.endsWith("==") ? 2 : data.endsWith("=") ? 1 : 0;
    return { data, width, height, bytes: (data.length / 4) * 3 - padding };
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    for (const track of this.stream.getTracks()) track.stop();
    this.preview.srcObject = null;
    this.preview.hidden = true;
  }
}
