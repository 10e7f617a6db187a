// The chat page (/chat): one self-contained page, like the dashboard (no external scripts, fonts
// or styles), that talks to this peer's own OpenAI API. It lists the models (/v1/models), streams
// an answer from /v1/chat/completions, stops it (the fetch is aborted: the gateway sees the
// connection close and cancels the stream on its peer), and shows which peer served the answer and
// any failover, from the stream's `tessera` fields (docs/HTTP.md). An API key, when the peer needs
// one, is taken from the page address: http://host:7480/chat#key=<key>.
#include "mesh/http/gateway.hpp"

namespace tessera::mesh::http {

namespace {

constexpr std::string_view kChatPage = R"html(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Tessera chat</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<style>
body{font:14px system-ui,sans-serif;margin:1.5em auto;max-width:52em;background:#fafafa;color:#222}
h1{font-size:1.4em;margin:0 0 .4em} a{color:#2b6cb0} #bar{margin:.6em 0} #bar label{margin-right:1em}
.msg{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.5em .8em;margin:.5em 0}
.msg.user{background:#eef4fb} .who{font-size:.8em;color:#666} .text{white-space:pre-wrap;margin:.2em 0}
.meta{font-size:.8em;color:#666} .failover{color:#b7791f;font-weight:bold} .bad{color:#b42318}
textarea{width:100%;box-sizing:border-box;font:inherit} button{margin:.3em .5em 0 0}
</style></head><body>
<h1>Tessera chat</h1><div><a id="dashboard" href="/">dashboard</a></div>
<div id="bar"><label>model <select id="model"></select></label>
<label>max tokens <input id="max" type="number" value="256" min="1" max="4096"></label>
<button id="new" type="button">new chat</button></div>
<div id="log"></div>
<form id="form"><textarea id="input" rows="3" placeholder="Message (Enter sends, Shift+Enter: new line)"></textarea>
<button id="send" type="submit">Send</button><button id="stop" type="button" disabled>Stop</button></form>
<div id="state">loading models…</div>
<script>
"use strict";
const key=(location.hash.match(/key=([^&]+)/)||[])[1];
const headers=key?{Authorization:"Bearer "+decodeURIComponent(key)}:{};
if(key)document.getElementById("dashboard").href="/#key="+key;
const $=id=>document.getElementById(id);
const esc=s=>String(s??"").replace(/[&<>"]/g,c=>({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;"}[c]));
const short=id=>String(id??"").slice(0,8);
let messages=[], ctrl=null;
async function models(){
  try{const r=await fetch("/v1/models",{headers}); const j=await r.json();
    if(!r.ok)throw new Error(j&&j.error?j.error.message:"HTTP "+r.status);
    $("model").innerHTML=j.data.map(m=>"<option>"+esc(m.id)+"</option>").join("");
    $("state").textContent=j.data.length?"ready":"no model is served";}
  catch(e){$("state").innerHTML="<span class='bad'>"+esc(e.message)+"</span>";}
}
function bubble(role,text){
  const d=document.createElement("div"); d.className="msg "+role;
  d.innerHTML="<div class='who'>"+role+"</div><div class='text'></div><div class='meta'></div>";
  d.querySelector(".text").textContent=text; $("log").appendChild(d); return d;
}
// Which peers served the answer: the first, and each one that took it over after a failover.
function describe(nodes,finish,err){
  let s=nodes.length?"served by <span class='node'>"+esc(short(nodes[0]))+"</span>":"waiting for a peer…";
  if(nodes.length>1)s+=" · <span class='failover'>failover: "+nodes.map(n=>esc(short(n))).join(" → ")+"</span>";
  if(finish)s+=" · "+esc(finish);
  if(err)s+=" · <span class='bad'>"+esc(err)+"</span>";
  return s;
}
async function send(text){
  messages.push({role:"user",content:text}); bubble("user",text);
  const b=bubble("assistant",""), t=b.querySelector(".text"), meta=b.querySelector(".meta");
  ctrl=new AbortController(); $("stop").disabled=false; $("send").disabled=true;
  let answer="", nodes=[], finish="", err="";
  const show=()=>{meta.innerHTML=describe(nodes,finish,err); b.dataset.nodes=nodes.join(",");};
  show();
  try{
    const r=await fetch("/v1/chat/completions",{method:"POST",signal:ctrl.signal,
      headers:Object.assign({"Content-Type":"application/json"},headers),
      body:JSON.stringify({model:$("model").value,messages,stream:true,max_tokens:Number($("max").value)||256})});
    if(!r.ok){const j=await r.json().catch(()=>null); throw new Error(j&&j.error?j.error.message:"HTTP "+r.status);}
    const rd=r.body.getReader(), dec=new TextDecoder(); let buf="";
    for(;;){
      const {value,done}=await rd.read(); if(done)break;
      buf+=dec.decode(value,{stream:true});
      for(let i;(i=buf.indexOf("\n\n"))>=0;){
        const ev=buf.slice(0,i); buf=buf.slice(i+2);
        if(!ev.startsWith("data: ")||ev==="data: [DONE]")continue;
        const j=JSON.parse(ev.slice(6));
        if(j.error){err=j.error.message; show(); continue;}
        if(j.tessera&&j.tessera.node&&nodes[nodes.length-1]!==j.tessera.node)nodes.push(j.tessera.node);
        if(j.tessera&&j.tessera.nodes&&j.tessera.nodes.length)nodes=j.tessera.nodes;
        const c=j.choices&&j.choices[0];
        if(c&&c.delta&&c.delta.content){answer+=c.delta.content; t.textContent=answer;}
        if(c&&c.finish_reason)finish=c.finish_reason==="length"?"length (max tokens)":c.finish_reason;
        show();
      }
    }
  }catch(e){if(e.name==="AbortError")finish="stopped"; else err=e.message;}
  messages.push({role:"assistant",content:answer});
  show(); b.dataset.finish=finish; b.dataset.done="1";
  ctrl=null; $("stop").disabled=true; $("send").disabled=false;
}
$("form").addEventListener("submit",e=>{e.preventDefault(); const v=$("input").value.trim();
  if(!v||ctrl)return; $("input").value=""; send(v);});
$("input").addEventListener("keydown",e=>{if(e.key==="Enter"&&!e.shiftKey){e.preventDefault(); $("form").requestSubmit();}});
$("stop").addEventListener("click",()=>{if(ctrl)ctrl.abort();});
$("new").addEventListener("click",()=>{if(ctrl)ctrl.abort(); messages=[]; $("log").innerHTML="";});
models();
</script></body></html>
)html";

}  // namespace

std::string_view chat_html() noexcept {
  return kChatPage;
}

}  // namespace tessera::mesh::http
