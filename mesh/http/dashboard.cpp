// The dashboard: one self-contained page (no external scripts, fonts or styles: a peer may have
// no internet, and the page must work from any peer). It polls /cluster (every live member's
// status, cached by the gateway for a second) and draws the mesh, the plan and the rates; rates
// are differences between two polls. An API key, when the peer needs one, is taken from the
// page address: http://host:7480/#key=<key>.
#include "mesh/http/gateway.hpp"

namespace tessera::mesh::http {

namespace {

constexpr std::string_view kPage = R"html(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Tessera</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<style>
body{font:14px system-ui,sans-serif;margin:1.5em;background:#fafafa;color:#222}
h1{font-size:1.4em;margin:0 0 .2em} h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;background:#fff} td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left}
th{background:#f0f0f0} .num{text-align:right;font-variant-numeric:tabular-nums}
.alive{color:#187a2f} .suspect{color:#b7791f} .dead,.left{color:#b42318} .leader{font-weight:bold}
#state{color:#666} .bad{color:#b42318} svg text{font:12px system-ui,sans-serif} svg text.id{font-size:10px}
</style></head><body>
<h1>Tessera</h1><div><a id="chat" href="/chat">chat</a></div><div id="state">connecting…</div>
<div id="summary"></div>
<h2>Topology</h2><svg id="graph" width="520" height="300"></svg>
<h2>Peers</h2><table id="peers"></table>
<h2>Links</h2><table id="links"></table>
<h2>Plan</h2><div id="plan"></div>
<script>
"use strict";
const key=(location.hash.match(/key=([^&]+)/)||[])[1];
const headers=key?{Authorization:"Bearer "+decodeURIComponent(key)}:{};
if(key)document.getElementById("chat").href="/chat#key="+key;
let last=null;
const esc=s=>String(s??"").replace(/[&<>"]/g,c=>({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;"}[c]));
const short=id=>String(id??"").slice(0,8);
const mb=v=>v>=1024?(v/1024).toFixed(1)+" GiB":v+" MiB";
function table(el,head,rows){document.getElementById(el).innerHTML="<tr>"+head.map(h=>"<th>"+h+"</th>").join("")+"</tr>"+rows.map(r=>"<tr>"+r.join("")+"</tr>").join("");}
function td(v,cls){return "<td"+(cls?' class="'+cls+'"':"")+">"+v+"</td>";}
function draw(docs){
  const ids=Object.keys(docs).sort();
  const self=ids.map(i=>docs[i]).find(d=>d&&d.view)||docs[ids[0]];
  if(!self||!self.node){document.getElementById("state").textContent="no status";return;}
  const n=self.node, view=self.view||{members:[],links:[],epoch:{}};
  const now=Date.now();
  // Requests counted when a peer accepts them (a long stream shows at once, not when it ends).
  let reqs=0,toks=0;
  for(const i of ids){const s=docs[i]&&docs[i].serving; if(s){reqs+=s.accepted||0;toks+=s.tokens||0;}}
  let rate="";
  if(last){const dt=(now-last.t)/1000; rate=" · "+((reqs-last.reqs)/dt).toFixed(2)+" requests/s · "+((toks-last.toks)/dt).toFixed(1)+" tokens/s";}
  const live=view.members.filter(m=>m.status==="alive"||m.status==="suspect").length, down=view.members.length-live;
  last={t:now,reqs,toks};
  document.getElementById("state").textContent="live · updated "+new Date().toLocaleTimeString();
  document.getElementById("summary").innerHTML="leader <b id='leader'>"+esc(short(n.leader)||"none")+"</b> · term <b id='term'>"+esc(n.term)+"</b> · view "+esc(view.epoch.term)+"."+esc(view.epoch.version)+" · <span id='peer-count'>"+live+" peers"+(down?", "+down+" down":"")+"</span>"+rate;
  table("peers",["peer","state","host","cores","memory free / total","models","streams","tokens served"],
    view.members.map(m=>{const d=docs[m.id]; const s=d&&d.serving;
      const running=s&&s.streams?s.streams.filter(x=>!x.queued).length:"?";
      const queued=s&&s.streams?s.streams.filter(x=>x.queued).length:0;
      return [td(esc(short(m.id))+(m.id===n.leader?" (leader)":""),m.id===n.leader?"leader":""),td(esc(m.status),m.status),
        td(esc(m.hostname)+":"+esc(m.pid)),td(m.cores,"num"),td(mb(m.memory_free_mb)+" / "+mb(m.memory_total_mb),"num"),
        td(esc((m.models||[]).join(", "))),td(running+(queued?" (+"+queued+" waiting)":""),"num"),td(s?s.tokens:"?","num")];}));
  table("links",["from","to","backend","bulk RTT","bandwidth","control RTT"],
    view.links.map(l=>[td(esc(short(l.from))),td(esc(short(l.to))),td(esc(l.backend)),
      td(l.bulk_rtt_us?(l.bulk_rtt_us<10?l.bulk_rtt_us.toFixed(2):l.bulk_rtt_us.toFixed(0))+" µs":"-","num"),
      td(l.bandwidth_mbps?(l.bandwidth_mbps/1000).toFixed(2)+" GB/s":"-","num"),
      td(l.rtt_us?l.rtt_us+" µs":"-","num")]));
  const plan=self.plan;
  document.getElementById("plan").innerHTML=!plan?"<p>no plan yet</p>":plan.models.map(m=>
    "<h3>"+esc(m.name)+"</h3>"+(m.no_capacity?"<p class='bad'>"+esc(m.no_capacity)+"</p>":"")+
    m.groups.map((g,gi)=>"<table><tr><th>group "+gi+"</th><th>stage</th><th>tensor rank</th><th>layers</th><th>heads</th></tr>"+
      g.map(r=>"<tr>"+td(esc(short(r.node)))+td(r.stage,"num")+td(r.tp_rank,"num")+td(r.layers[0]+"–"+(r.layers[1]-1))+td(r.heads[0]+"–"+(r.heads[1]-1))+"</tr>").join("")+"</table>").join("<br>")).join("");
  graph(view,n.leader);
}
function graph(view,leader){
  const svg=document.getElementById("graph"), W=520,H=300,R=110,cx=W/2,cy=H/2;
  const ms=view.members, pos={};
  ms.forEach((m,i)=>{const a=2*Math.PI*i/Math.max(1,ms.length)-Math.PI/2; pos[m.id]=[cx+R*Math.cos(a),cy+R*Math.sin(a)];});
  let s="";
  for(const l of view.links){const a=pos[l.from],b=pos[l.to]; if(!a||!b||l.from>l.to)continue;
    s+="<line x1='"+a[0]+"' y1='"+a[1]+"' x2='"+b[0]+"' y2='"+b[1]+"' stroke='#9aa' stroke-width='2'/>";
    s+="<text x='"+((a[0]+b[0])/2)+"' y='"+((a[1]+b[1])/2-4)+"' text-anchor='middle' fill='#456'>"+esc(l.backend)+" "+(l.rtt_us||"?")+"µs</text>";}
  for(const m of ms){const p=pos[m.id];
    // A peer that is down is drawn grey, one suspected amber: not in a live peer's colour.
    const fill=m.status==="dead"||m.status==="left"?"#c9ced6":m.status==="suspect"?"#d69e2e":m.id===leader?"#2b6cb0":"#8fb3d9";
    s+="<circle cx='"+p[0]+"' cy='"+p[1]+"' r='22' fill='"+fill+"'><title>"+esc(m.id)+" ("+esc(m.status)+")</title></circle>";
    s+="<text class='id' x='"+p[0]+"' y='"+(p[1]+4)+"' text-anchor='middle' fill='#fff'>"+esc(short(m.id).slice(0,6))+"</text>";}
  svg.innerHTML=s;
}
async function poll(){
  try{const r=await fetch("/cluster",{headers}); if(!r.ok)throw new Error("HTTP "+r.status+": "+(await r.text()));
    draw(await r.json());}
  catch(e){document.getElementById("state").innerHTML="<span class='bad'>"+esc(e.message)+"</span>";}
  setTimeout(poll,1000);
}
poll();
</script></body></html>
)html";

}  // namespace

std::string_view dashboard_html() noexcept {
  return kPage;
}

}  // namespace tessera::mesh::http
